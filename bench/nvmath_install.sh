#!/usr/bin/env bash
# Installs the carried nvmath-python device tier (the small linear-algebra family's optional
# dependency arms, spec 003) into the device machine's Python environment (it has no network):
# the wheels in ${NVMATH_WHEELS:-.carry/nvmath} (nvmath-python, nvidia-libmathdx-cu13,
# cuda-pathfinder, nvidia-cuda-cccl) and, from nvvm.txz, the nvidia-nvvm wheel's libnvvm,
# libdevice and header (numba-cuda compiles through libnvvm; the machine has none; cicc left
# out to fit the carry). cuda.pathfinder finds libraries only under site-packages, so everything
# goes there. Prints what the machine had.
set -u
W=${NVMATH_WHEELS:-.carry/nvmath}
SP=$(python -c "import site; print(site.getsitepackages()[0])")
echo "[nvmath] the machine's packages ($SP):"; python -m pip list 2>/dev/null | grep -i -E "numba|cuda|nvidia|llvmlite|nvmath|numpy" | sed 's/^/  /'
python -m pip install -q --no-deps --no-index "$W"/*.whl 2>&1 | grep -v -i warning | tail -3
[ -f "$W/nvvm.txz" ] && tar xJf "$W/nvvm.txz" -C "$SP"
if python -c "import numpy as np; np.row_stack = getattr(np, 'row_stack', np.vstack); import nvmath.device" > /tmp/nvmath_import.log 2>&1; then
  echo "[nvmath] import ok"
else
  echo "[nvmath] import failed:"; grep -v "^    lib" /tmp/nvmath_import.log | tail -6
  exit 1  # what follows an install with && must not run on a half-installed tier
fi
