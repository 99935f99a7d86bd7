#!/usr/bin/env bash
# Session 41's device stages. Usage: bash bench/device_s41.sh STAGE...
#   tests41   pytest -m gpu over session 40's fusion surgery (tests/gpu/test_fusion_surgery_gpu.py) and
#             the files its changes touch (robust models, API edges, conv, runtime, siblings, unseen zoo)
#   eagerun   bench/eager_profile.py --model unseen: where the eager host time of a decoder no table
#             names goes, plain against tunedb.optimize() (per-module hooks, torch.profiler)
#   timerprobe bench/timer_probe.py: the CUDA-graph timer's baselines and raw samples at prewarm's points
#   hostcost  bench/linear_host_cost.py: host us per eager call, nn.Linear against a sibling left as written
#   agree     bench/device_s25.sh agree-all with the linalg keep rule (--keep the shipped table)
#   other stages go to bench/device_s38.sh (unseen, zoo, rowse2e, rows, probe3b, fp8xm, build5, pack)
. "$(dirname "$0")/device_env.sh"
for stage in "$@"; do
  case "$stage" in
    tests41) stamp "stage tests41"; timeout ${TESTS_S:-300} python -m pytest -m gpu -q -p no:cacheprovider \
               ${GPU_TESTS:-tests/gpu/test_fusion_surgery_gpu.py tests/gpu/test_models_robust_gpu.py tests/gpu/test_api_edges_gpu.py tests/gpu/test_conv_gpu.py tests/gpu/test_runtime_gpu.py tests/gpu/test_gemm_siblings_gpu.py tests/gpu/test_unseen_zoo_gpu.py} \
               > "$OUT/tests41.txt" 2>&1; tail -12 "$OUT/tests41.txt" ;;
    eagerun) stamp "stage eagerun"; timeout ${EP_S:-120} python bench/eager_profile.py --model unseen --quick \
               --batches ${EP_BATCHES:-1,16} --no-s17-backoff --out "$OUT/eager_unseen.json" > "$OUT/eager_unseen.txt" 2>&1
             head -60 "$OUT/eager_unseen.txt" ;;
    timerprobe) stamp "stage timerprobe"; timeout ${TP_S:-120} python bench/timer_probe.py --out "$OUT/timer_probe.json" \
                  > "$OUT/timer_probe.txt" 2>&1; cat "$OUT/timer_probe.txt" | cut -c1-400 | head -40 ;;
    hostcost) stamp "stage hostcost"; timeout 60 python bench/linear_host_cost.py 2>&1 | tee "$OUT/linear_host_cost.txt" ;;
    agree) stamp "stage agree"; AGREE_S=${AGREE_S:-300} AGREE_TUNE_ARGS="--keep src/tunedb/db/sm90/linalg.json" \
             OUT=$OUT bash bench/device_s25.sh agree-all 2>&1 | tail -30 ;;
    *) OUT=$OUT bash bench/device_s38.sh "$stage" ;;
  esac
done
stamp done
