# The device stage scripts' shared start (sourced by bench/device_s34.sh, device_s35.sh): strict
# shell, import paths, tunedb's cache and user tier under /tmp, $OUT, stamp() for stage
# timings in $OUT/stages.log, and the GPU's clocks and the torch / Triton versions in $OUT/env.log.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}"
export TUNEDB_CACHE_DIR=${TUNEDB_CACHE_DIR:-/tmp/tunedb-cache} TUNEDB_USER_DB=${TUNEDB_USER_DB:-/tmp/tunedb-user}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; t0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/stages.log"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/env.log" 2>&1
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/env.log" 2>&1
python -c "import transformers; print('transformers', transformers.__version__)" >> "$OUT/env.log" 2>&1
