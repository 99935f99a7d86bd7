#!/usr/bin/env bash
# Session 23's device calls: this session's stages, each in its own tarball ($OUT/<stage>.tgz);
# any other stage name is handed to bench/device_s22.sh (and on down).
# SKIP_AFTER_S skips every later stage once the call has run that long.
#   bash bench/device_s23.sh ncu block-bounds tile-anatomy
# ncu          bench/linalg_ncu.sh: Nsight Compute reports of CUDA-tier cells (NCU_CELLS)
# block-bounds bench/block_bounds.py (BOUNDS_ARGS, e.g. --wide): CUDA-tier kernels with their registers capped
. "$(dirname "$0")/device_runner.sh"
for s in "$@"; do
  skipping "$s" && continue
  case $s in
    ncu) run_stage ncu "${NCU_S:-300}" "bash bench/linalg_ncu.sh" ;;
    block-bounds) run_stage block_bounds "${BOUNDS_S:-200}" "PYTHONPATH=src python bench/block_bounds.py ${BOUNDS_ARGS:-} --out \$OUT/block_bounds.json" ;;
    *) bash "$HERE/device_s22.sh" "$s" ;;
  esac
done
echo "[device_s23] done in $(( $(date +%s) - T0 )) s"
