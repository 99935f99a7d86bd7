#!/usr/bin/env bash
# Session 47's device stages. Usage: bash bench/device_s47.sh STAGE...
#   (NG_LAYERS=8: a deeper, less host-bound model; NG_ORDER=--tuned-first: the other compile order)
#   graphs    bench/compile_nograph.py with mode="reduce-overhead" (Inductor's CUDA graphs keep the tuned
#             picks opaque), now with each model's GPU kernels and their device time
#   forced    the same in default mode with TUNEDB_COMPILED_GRAPHS=1 (the picks kept, no graphs): the
#             kernels the compiled graphs replay, listed where CUPTI does not see inside a graph
#   graphsib  graphs with TUNEDB_COMPILED_SIBLINGS=1 (a group's members on one tensor compile to one
#             launch: siblings_compile.py), its own process: what the groups add to graphs' picks
#   nograph   bench/compile_nograph.py in default mode (no graphs; picks decompose to F.linear), now with each
#             model's GPU kernels: whether the 0.95-0.96 gap of session 47 is device time or host time
#   tests47   pytest -m gpu over siblings_compile's and the sibling groups' GPU tests (log: tests47.txt)
#   other stages go to bench/device_s46.sh (tests46, orders), then device_s45 / s43 / s37
. "$(dirname "$0")/device_env.sh"
for stage in "$@"; do
  case "$stage" in
    graphs) stamp "stage graphs"
            timeout ${NG_S:-180} python bench/compile_nograph.py --model ${NG_MODEL:-llama-3-8b} --mode reduce-overhead \
              --batches ${NG_BATCHES:-1,16} ${NG_LAYERS:+--layers $NG_LAYERS} ${NG_ORDER:-} \
              --out "$OUT/compile_graphs.json" > "$OUT/compile_graphs.txt" 2>&1
            grep "== \|ms compile\|GPU:" "$OUT/compile_graphs.txt" | cut -c1-1500 ;;
    graphsib) stamp "stage graphsib"
            TUNEDB_COMPILED_SIBLINGS=1 timeout ${NG_S:-180} python bench/compile_nograph.py --model ${NG_MODEL:-llama-3-8b} \
              --mode reduce-overhead --batches ${NG_BATCHES:-1,16} ${NG_LAYERS:+--layers $NG_LAYERS} ${NG_ORDER:-} --out "$OUT/compile_graphsib.json" > "$OUT/compile_graphsib.txt" 2>&1
            grep "== \|ms compile\|GPU:" "$OUT/compile_graphsib.txt" | cut -c1-1500 ;;
    tests47) stamp "stage tests47"
             timeout ${TESTS_S:-300} python -m pytest -m gpu -q -p no:cacheprovider \
               ${GPU_TESTS:-tests/gpu/test_siblings_compile_gpu.py tests/gpu/test_gemm_siblings_gpu.py} \
               > "$OUT/tests47.txt" 2>&1; tail -15 "$OUT/tests47.txt" ;;
    nograph) stamp "stage nograph"
            timeout ${NG_S:-180} python bench/compile_nograph.py --model ${NG_MODEL:-llama-3-8b} \
              --batches ${NG_BATCHES:-1,16} ${NG_LAYERS:+--layers $NG_LAYERS} ${NG_ORDER:-} --out "$OUT/nograph.json" > "$OUT/nograph.txt" 2>&1
            grep "== \|ms compile\|GPU:" "$OUT/nograph.txt" | cut -c1-1500 ;;
    forced) stamp "stage forced"
            TUNEDB_COMPILED_GRAPHS=1 timeout ${NG_S:-180} python bench/compile_nograph.py --model ${NG_MODEL:-llama-3-8b} \
              --batches ${NG_BATCHES:-1,16} --out "$OUT/compile_forced.json" > "$OUT/compile_forced.txt" 2>&1
            grep "== \|ms compile\|GPU:" "$OUT/compile_forced.txt" | cut -c1-1500 ;;
    *) OUT=$OUT bash bench/device_s46.sh "$stage" ;;
  esac
done
stamp done
