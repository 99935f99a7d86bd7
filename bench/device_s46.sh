#!/usr/bin/env bash
# Session 46's device stages. Usage: bash bench/device_s46.sh STAGE...
#   tests46   device_s45.sh's tests45 over the files session 46 changed after its last call (the Inductor test of
#             a Triton pick the eager rule yields; siblings under compile; host_bound)
#   orders    bench/compile_nograph.py with the plain model compiled first, then the tuned one first
#             (the two share HF's code objects: the second compiled pays the first's failed guard)
#   graphs    the same pair compiled with mode="reduce-overhead" (Inductor's CUDA graphs: the picks stay)
#   other stages go to bench/device_s45.sh (tests45, nograph), then device_s43.sh (tpparts with TP=1),
#   then device_s37.sh's unseen / zoo
. "$(dirname "$0")/device_env.sh"
for stage in "$@"; do
  case "$stage" in
    tests46) GPU_TESTS=${GPU_TESTS:-"tests/gpu/test_runtime_gpu.py tests/gpu/test_gemm_siblings_gpu.py tests/gpu/test_host_bound_gpu.py"} \
             TESTS_S=${TESTS_S:-240} OUT=$OUT bash bench/device_s45.sh tests45 ;;  # its runner, these files (log: tests45.txt)
    orders) stamp "stage orders"
            for first in "" "--tuned-first"; do
              timeout ${NG_S:-150} python bench/compile_nograph.py --model ${NG_MODEL:-llama-3-8b} \
                --batches ${NG_BATCHES:-1,16} $first --out "$OUT/nograph${first}.json" > "$OUT/nograph${first}.txt" 2>&1
              grep "== \|ms compile" "$OUT/nograph${first}.txt"
            done ;;
    graphs) stamp "stage graphs"
            timeout ${NG_S:-150} python bench/compile_nograph.py --model ${NG_MODEL:-llama-3-8b} --mode reduce-overhead \
              --batches ${NG_BATCHES:-1,16} --out "$OUT/compile_graphs.json" > "$OUT/compile_graphs.txt" 2>&1
            grep "== \|ms compile" "$OUT/compile_graphs.txt" ;;
    *) OUT=$OUT bash bench/device_s45.sh "$stage" ;;
  esac
done
stamp done
