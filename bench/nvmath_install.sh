#!/usr/bin/env bash
# Installs the carried nvmath-python device tier (the small linear-algebra family's optional
# dependency arms, spec 003) on the device machine, which has no network: the wheels in
# ${NVMATH_WHEELS:-.carry/nvmath} (nvmath-python, nvidia-libmathdx-cu13, cuda-pathfinder,
# nvidia-cuda-cccl; numba-cuda and cuda-core only where the machine's own are too old for
# nvmath's import) into /tmp/nvsite (prepend it to PYTHONPATH). Prints what the machine had.
set -u
W=${NVMATH_WHEELS:-.carry/nvmath}
echo "[nvmath] the machine's packages:"; python -m pip list 2>/dev/null | grep -i -E "numba|cuda|nvidia|llvmlite|nvmath" | sed 's/^/  /'
# numba-cuda compiles through libnvvm, which the machine lacks: the carried nvidia-nvvm wheel's
# library, libdevice and header (nvvm.txz, without cicc), under /tmp/nvsite/nvidia/cu13 and as
# a CUDA_HOME-style tree /tmp/nvcuda (export CUDA_HOME=/tmp/nvcuda)
mkdir -p /tmp/nvsite /tmp/nvcuda/nvvm/lib64 /tmp/nvcuda/nvvm/libdevice
[ -f "$W/nvvm.txz" ] && tar xJf "$W/nvvm.txz" -C /tmp/nvsite
ln -sf /tmp/nvsite/nvidia/cu13/lib/libnvvm.so.4 /tmp/nvcuda/nvvm/lib64/libnvvm.so.4
ln -sf /tmp/nvsite/nvidia/cu13/lib/libnvvm.so.4 /tmp/nvcuda/nvvm/lib64/libnvvm.so
ln -sf /tmp/nvsite/nvidia/cu13/nvvm/libdevice/libdevice.10.bc /tmp/nvcuda/nvvm/libdevice/libdevice.10.bc
pip install -q --no-deps --no-index --target /tmp/nvsite "$W"/nvmath_python-*.whl "$W"/nvidia_libmathdx*.whl \
  "$W"/cuda_pathfinder*.whl "$W"/nvidia_cuda_cccl*.whl 2>&1 | grep -v -i warning | tail -3
if ! PYTHONPATH=/tmp/nvsite python -c "import numpy as np; np.row_stack = getattr(np, 'row_stack', np.vstack); import nvmath.device" > /tmp/nvsite_import.log 2>&1; then
  echo "[nvmath] import with the machine's numba-cuda / cuda-core failed:"; tail -4 /tmp/nvsite_import.log
  pip install -q --no-deps --no-index --target /tmp/nvsite "$W"/numba_cuda-*.whl "$W"/cuda_core-*.whl 2>&1 | grep -v -i warning | tail -3
  PYTHONPATH=/tmp/nvsite python -c "import numpy as np; np.row_stack = getattr(np, 'row_stack', np.vstack); import nvmath.device" > /tmp/nvsite_import2.log 2>&1 && echo "[nvmath] import ok with the carried numba-cuda / cuda-core" || tail -4 /tmp/nvsite_import2.log
else
  echo "[nvmath] import ok with the machine's numba-cuda / cuda-core"
fi
