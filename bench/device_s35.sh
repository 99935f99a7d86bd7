#!/usr/bin/env bash
# Session 35's device stages (see BENCHMARKS.md "Session 35"): each stage under its own timeout,
# logs under $OUT. Usage: bash bench/device_s35.sh STAGE...
#   tests     GPU tests named by GPU_TESTS (default: rnn and API edges, for the LSTM / GRU class swap)
#   preplain  bench/gv_pre_plain.py (gv's wide first tile without PDL, separator and back to back)
#   siblings  bench/siblings_gemv.py and bench/sibling_fusion_probe.py (one launch for sibling projections)
#   other stages go to bench/device_s34.sh (gvtests build e2e chain chaine2e zoo)
. "$(dirname "$0")/device_env.sh"
for stage in "$@"; do
  stamp "stage $stage"
  case "$stage" in
    tests) timeout ${TESTS_S:-200} python -m pytest -m gpu -q -p no:cacheprovider \
             ${GPU_TESTS:-tests/gpu/test_rnn_gpu.py tests/gpu/test_api_edges_gpu.py} 2>&1 | tee "$OUT/tests.log" | tail -15 ;;
    preplain) timeout ${PP_S:-200} python bench/gv_pre_plain.py --out "$OUT/gv_pre_plain.json" 2>&1 \
             | tee "$OUT/gv_pre_plain.log" | tail -16 ;;
    siblings) timeout ${SIB_S:-120} python bench/siblings_gemv.py --out "$OUT/siblings_gemv.json" 2>&1 \
             | tee "$OUT/siblings_gemv.log" | tail -22
           timeout ${PROBE_S:-150} python bench/sibling_fusion_probe.py --out "$OUT/sibling_fusion_probe.json" 2>&1 \
             | tee "$OUT/sibling_fusion_probe.log" | tail -18 ;;
    *) OUT=$OUT bash bench/device_s34.sh "$stage" ;;
  esac
done
stamp done
