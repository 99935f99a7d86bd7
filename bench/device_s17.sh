#!/usr/bin/env bash
# Session 17's device calls: this session's stages, each in its own tarball ($OUT/<stage>.tgz);
# any other stage name is handed to bench/device_s16.sh (and on down to device_s14.sh).
# SKIP_AFTER_S skips every later stage once the call has run that long.
#   bash bench/device_s17.sh block-build fp8-block-exh pending host
# block-build  the fp8 block-scaled entries rebuilt (NOT --fresh: the file holds the row-wise
#              entries too), the table copied to $OUT/db/ (~90 s)
# pending      GPU tests the previous session never ran (autocast rule, robust models) (~80 s)
# host         bench/host_overhead.py (host cost per call, eager; ~60 s)
. "$(dirname "$0")/device_runner.sh"
for s in "$@"; do
  skipping "$s" && continue
  case $s in
    block-build) run_stage block_build "${BLOCK_S:-150}" "python -m tunedb build --family scaled_mm_fp8 --out system --no-fill --top-k 16 --tie-band 0.01 --census bench/census/quant_llama_fp8-block.json --run-id s17-block-\$(date +%s) && cp src/tunedb/db/sm90/scaled_mm_fp8.json \$FINAL/db/" ;;
    pending) run_stage pending "${PENDING_S:-150}" "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_api_edges_gpu.py tests/gpu/test_models_robust_gpu.py" ;;
    host) run_stage host "${HOST_S:-120}" "python bench/host_overhead.py --out \$OUT/host_overhead.json" ;;
    *) bash "$HERE/device_s16.sh" "$s" ;;
  esac
done
echo "[device_s17] done in $(( $(date +%s) - T0 )) s"
