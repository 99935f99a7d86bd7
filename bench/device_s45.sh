#!/usr/bin/env bash
# Session 45's device stages. Usage: bash bench/device_s45.sh STAGE...
#   tests45   pytest -m gpu over the files session 45's changes after its last call touch (quiet
#             members: siblings, host_bound, unseen_zoo)
#   nograph   bench/compile_nograph.py: tunedb+compile against compile without CUDA graphs, taken
#             apart (graph breaks, calls still reaching tunedb, torch.profiler's CPU ops)
#   other stages go to bench/device_s43.sh (tpparts with TP=1 for Llama-3-8B's widths), then
#   device_s37.sh's unseen / zoo through it
. "$(dirname "$0")/device_env.sh"
for stage in "$@"; do
  case "$stage" in
    tests45) stamp "stage tests45"
             timeout ${TESTS_S:-300} python -m pytest -m gpu -q -p no:cacheprovider \
               ${GPU_TESTS:-tests/gpu/test_gemm_siblings_gpu.py tests/gpu/test_host_bound_gpu.py tests/gpu/test_unseen_zoo_gpu.py} \
               > "$OUT/tests45.txt" 2>&1; tail -8 "$OUT/tests45.txt" ;;
    nograph) stamp "stage nograph"; timeout ${NG_S:-240} python bench/compile_nograph.py --model ${NG_MODEL:-llama-3-8b} \
               --batches ${NG_BATCHES:-1,16} --out "$OUT/compile_nograph.json" > "$OUT/compile_nograph.txt" 2>&1
             grep -v "^USDT" "$OUT/compile_nograph.txt" | tail -14 ;;
    *) OUT=$OUT bash bench/device_s43.sh "$stage" ;;
  esac
done
stamp done
