#!/usr/bin/env bash
# Session 43's device stages. Usage: bash bench/device_s43.sh STAGE...
#   tests43   pytest -m gpu over the files session 42's changes touched and never ran on the GPU
#             (siblings' TP shard graph test and split tiles, group_gemm after the MoE rounding change,
#             conv and the log-softmax head after the transform checks, unseen zoo, API edges, torchao
#             layers (carry .stage: the torchao wheel is installed first), robust models)
#   tpparts   bench/tp_shard_decode.py --tp 4 --parts: the shard's eager excess taken apart
#             (siblings off; served layers running F.linear)
#   walls     bench/tp_shard_profile.py --walls: the shard's eager forward, gc on and off
#   trace     bench/tp_shard_trace.py: a served layer's in-place host time and torch.profiler's table
#   host      bench/linear_host_cost.py --pieces --served: a member's and a served layer's eager host cost
#   moe       bench/moe.py --quick: the group_gemm kernel part and two MoE layers end to end
#   other stages go to bench/device_s41.sh
. "$(dirname "$0")/device_env.sh"
for stage in "$@"; do
  case "$stage" in
    tests43) stamp "stage tests43"
             ls .stage/wheels/torchao-*.whl >/dev/null 2>&1 && python -m pip install -q --no-deps --no-index .stage/wheels/torchao-*.whl
             timeout ${TESTS_S:-300} python -m pytest -m gpu -q -p no:cacheprovider \
               ${GPU_TESTS:-tests/gpu/test_gemm_siblings_gpu.py tests/gpu/test_group_gemm_gpu.py tests/gpu/test_conv_gpu.py tests/gpu/test_gemm_log_softmax_gpu.py tests/gpu/test_unseen_zoo_gpu.py tests/gpu/test_api_edges_gpu.py tests/gpu/test_scaled_mm_torchao_gpu.py tests/gpu/test_models_robust_gpu.py} \
               > "$OUT/tests43.txt" 2>&1; tail -15 "$OUT/tests43.txt" ;;
    tpparts) stamp "stage tpparts"; timeout ${TP_S:-120} python bench/tp_shard_decode.py --tp ${TP:-4} --parts \
               --out "$OUT/tp_parts.json" 2>&1 | tee "$OUT/tp_parts.txt" | tail -22 ;;
    walls) stamp "stage walls"; timeout 60 python bench/tp_shard_profile.py --tp ${TP:-4} --walls 2>&1 | tee "$OUT/walls.txt" | tail -6 ;;
    trace) stamp "stage trace"; timeout 120 python bench/tp_shard_trace.py --tp ${TP:-4} --batch ${B:-1} > "$OUT/trace.txt" 2>&1
           head -12 "$OUT/trace.txt"; grep -A26 "^== " "$OUT/trace.txt" | cut -c1-170 ;;
    host) stamp "stage host"; timeout 90 python bench/linear_host_cost.py --pieces --served --rows 1,16 2>&1 | tee "$OUT/host.txt" | tail -30 ;;
    moe) stamp "stage moe"; timeout ${MOE_S:-280} python bench/moe.py --quick --out "$OUT/moe" \
           > "$OUT/moe.txt" 2>&1; tail -40 "$OUT/moe.txt" ;;
    *) OUT=$OUT bash bench/device_s41.sh "$stage" ;;
  esac
done
stamp done
