#!/usr/bin/env bash
# Session 29's device calls: this session's stages, each in its own tarball ($OUT/<stage>.tgz);
# any other stage name is handed to bench/device_s25.sh (and on down).
#   bash bench/device_s29.sh direct host
# direct  pytest -m gpu: session 28's eager entry points (direct path) and the families they touch (DIRECT_TESTS overrides the files)
# host    bench/op_host_cost.py: host microseconds per eager call, op vs entry point, in one run
# linalg-eager  bench/linalg_eager.py --profile: eager tunedb.linalg vs torch per call (wall, host, graph), cProfile
# gpu-tests     pytest -m gpu on GPU_TESTS
. "$(dirname "$0")/device_runner.sh"
for s in "$@"; do
  skipping "$s" && continue
  case $s in
    direct) run_stage direct "${DIRECT_S:-300}" "PYTHONPATH=src python -m pytest -m gpu -q ${DIRECT_TESTS:-tests/gpu/test_direct_entries_gpu.py tests/gpu/test_bmm_gpu.py tests/gpu/test_conv_gpu.py tests/gpu/test_gemm_log_softmax_gpu.py tests/gpu/test_group_gemm_gpu.py tests/gpu/test_api_edges_gpu.py} -rf 2>&1 | tail -150" ;;
    host) run_stage host "${HOST_S:-150}" "PYTHONPATH=src python bench/op_host_cost.py --iters 800 --out \$OUT/op_host_cost.json" ;;
    linalg-eager) run_stage linalg_eager "${LE_S:-300}" "PYTHONPATH=src python bench/linalg_eager.py --profile ${LE_ARGS:-} --out \$OUT/linalg_eager.json" ;;
    gpu-tests) run_stage gpu_tests "${GT_S:-300}" "PYTHONPATH=src python -m pytest -m gpu -q ${GPU_TESTS:-tests/gpu/test_linalg_eager_gpu.py} -rf 2>&1 | tail -150" ;;
    *) bash "$HERE/device_s25.sh" "$s" ;;
  esac
done
echo "[device_s29] done in $(( $(date +%s) - T0 )) s"
