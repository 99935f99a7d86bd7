#!/usr/bin/env bash
# Session 37's device stages, each under its own timeout, logs under $OUT. Usage:
# bash bench/device_s37.sh STAGE...
#   tests     GPU tests named by GPU_TESTS (default: the sibling groups, and what the 2-16 row
#             default reaches: the unseen zoo, robust models, API edges, runtime)
#   rows      bench/siblings_gemv.py at M = 2, 4, 16 over every group (bf16): the 2-16 row path's
#             tiles (x or W on the MMA's M side) and the weight size past which cuBLAS one by one wins
#   rowse2e   bench/sibling_fusion_probe.py with TUNEDB_SIBLING_ROWS=1 and =16 (Llama-3-8B decode
#             b1 / b16 end to end, CUDA graphs)
#   unseen    bench/unseen_model.py: a decoder no table names (biased q/k/v, gate/up), b1 / b16 / prefill
#   zoo       bench/unseen_zoo.py: fourteen models no table names, optimize() vs plain
#   other stages go to bench/device_s36.sh
. "$(dirname "$0")/device_env.sh"
for stage in "$@"; do
  stamp "stage $stage"
  case "$stage" in
    tests) timeout ${TESTS_S:-240} python -m pytest -m gpu -q -p no:cacheprovider \
             ${GPU_TESTS:-tests/gpu/test_gemm_siblings_gpu.py tests/gpu/test_unseen_zoo_gpu.py tests/gpu/test_models_robust_gpu.py tests/gpu/test_api_edges_gpu.py tests/gpu/test_runtime_gpu.py} \
             > "$OUT/tests.txt" 2>&1; tail -8 "$OUT/tests.txt" ;;
    rows) timeout ${ROWS_S:-300} python bench/siblings_gemv.py --rows ${ROWS:-2,4,16} --dtypes bfloat16 \
             --out "$OUT/siblings_rows.json" 2>&1 | tee "$OUT/siblings_rows.log" | tail -${ROWS_TAIL:-40} ;;
    rowse2e) for r in ${E2E_ROWS:-1 16}; do
               TUNEDB_SIBLING_ROWS=$r timeout ${PROBE_S:-150} python bench/sibling_fusion_probe.py \
                 --out "$OUT/sibling_probe_rows$r.json" 2>&1 | tee "$OUT/sibling_probe_rows$r.log" | tail -9
             done ;;
    unseen) timeout ${UM_S:-150} python bench/unseen_model.py --out "$OUT/unseen_model.json" > "$OUT/unseen_model.txt" 2>&1
            tail -12 "$OUT/unseen_model.txt" ;;
    zoo) timeout ${ZOO_S:-200} python bench/unseen_zoo.py --out "$OUT/zoo.json" > "$OUT/zoo.txt" 2>&1; tail -24 "$OUT/zoo.txt" ;;
    *) OUT=$OUT bash bench/device_s36.sh "$stage" ;;
  esac
done
stamp done
