#!/usr/bin/env bash
# Builds .carry/nvmath (gitignored), what the device needs for linalg's optional cuSOLVERDx tier
# (bench/nvmath_install.sh installs it there; pass carry [".carry/nvmath"] to the device call):
# the cp312 manylinux wheels of nvmath-python, nvidia-libmathdx-cu13, cuda-pathfinder and
# nvidia-cuda-cccl (the versions session 19 measured with), and nvvm.txz, the nvidia-nvvm wheel's
# nvidia/ tree without cicc (libnvvm, libdevice, nvvm.h: the device has no libnvvm, and the whole
# wheel would not fit the 64 MiB carry beside the tree). About 41 MB; needs PyPI.
set -eu
OUTDIR=${1:-.carry/nvmath}
mkdir -p "$OUTDIR"
plat="--python-version 3.12 --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64"
pip download -q --no-deps -d "$OUTDIR" $plat nvmath-python==1.0.0 nvidia-libmathdx-cu13==0.3.2.6 \
  cuda-pathfinder==1.9.1 nvidia-cuda-cccl==13.0.85
tmp=$(mktemp -d)
pip download -q --no-deps -d "$tmp" $plat nvidia-nvvm==13.0.88
(cd "$tmp" && python -m zipfile -e nvidia_nvvm-*.whl x && rm -f x/nvidia/cu13/nvvm/bin/cicc && tar cf - -C x nvidia | xz -9 -T0 > nvvm.txz)
mv "$tmp/nvvm.txz" "$OUTDIR/" && rm -rf "$tmp"
du -sh "$OUTDIR"
