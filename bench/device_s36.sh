#!/usr/bin/env bash
# Session 36's device stages, prepared without a device (none was lent in session 36): each stage
# under its own timeout, logs under $OUT. Usage: bash bench/device_s36.sh STAGE...
#   tests     GPU tests named by GPU_TESTS (default: what changed since session 35's last device
#             call: siblings (weight stamps, guards, the 2-16 row path), conv, log-softmax head,
#             group_gemm (the trace-friendly grad form), API edges)
#   rows      bench/siblings_gemv.py at M = 1, 4, 8, 16 (the group's tensor-core path against one
#             cuBLAS call per sibling and over the concatenated weights)
#   rowse2e   bench/sibling_fusion_probe.py with TUNEDB_SIBLING_ROWS=1 and =16 (Llama-3-8B decode
#             b1 / b16 end to end, CUDA graphs): whether the 2-16 row path earns its default
#   other stages go to bench/device_s35.sh (siblings preplain) and bench/device_s34.sh
. "$(dirname "$0")/device_env.sh"
for stage in "$@"; do
  stamp "stage $stage"
  case "$stage" in
    tests) timeout ${TESTS_S:-300} python -m pytest -m gpu -q -p no:cacheprovider \
             ${GPU_TESTS:-tests/gpu/test_gemm_siblings_gpu.py tests/gpu/test_conv_gpu.py tests/gpu/test_gemm_log_softmax_gpu.py tests/gpu/test_group_gemm_gpu.py tests/gpu/test_api_edges_gpu.py} \
             2>&1 | tee "$OUT/tests.log" | tail -15 ;;
    rows) timeout ${ROWS_S:-240} python bench/siblings_gemv.py --rows 1,4,8,16 --dtypes bfloat16 \
             --groups "llama3-8b qkv,llama3-8b gate/up,qwen2-7b qkv,small decoder qkv" \
             --out "$OUT/siblings_rows.json" 2>&1 | tee "$OUT/siblings_rows.log" | tail -30 ;;
    rowse2e) for r in 1 16; do
               TUNEDB_SIBLING_ROWS=$r timeout ${PROBE_S:-150} python bench/sibling_fusion_probe.py \
                 --out "$OUT/sibling_probe_rows$r.json" 2>&1 | tee "$OUT/sibling_probe_rows$r.log" | tail -12
             done ;;
    *) OUT=$OUT bash bench/device_s35.sh "$stage" ;;
  esac
done
stamp done
