#!/usr/bin/env bash
# Session 10's device calls: stages by name, each under its own timeout, logs under $OUT.
#   bash bench/device_s10.sh STAGE...   (run on the device from the repository root)
# GPU test files that only check kernels run side by side (their Triton compiles are CPU-bound);
# anything timed, and anything with the protocol's busy-GPU refusal, runs alone.
set -u
OUT=${OUT:-/tmp/out}
FINAL=$OUT
OUT=$FINAL/logs  # everything lands here; packed into one logs.tgz at the end (few files come back)
mkdir -p "$OUT"
export PYTHONPATH=src TUNEDB_USER_DB=off
stage() {  # name timeout_s command...
  local name=$1 t=$2; shift 2
  local t0=$(date +%s)
  echo "[stage $name] start $(date -u +%T)"
  timeout "$t" bash -c "$*" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "[stage $name] rc=$rc in $(( $(date +%s) - t0 )) s"
  tail -n 6 "$OUT/$name.log"
  tar -czf "$FINAL/.logs.$name.tmp" -C "$FINAL" logs 2>/dev/null && mv -f "$FINAL/.logs.$name.tmp" "$FINAL/logs.tgz"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv > "$OUT/smi.txt" 2>&1
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/smi.txt" 2>&1
for s in "$@"; do
  case $s in
    kernel-tests)  # side by side: kernels against references, captured graphs
      stage kt_bmm 200 "python -m pytest -m gpu -q tests/gpu/test_bmm_gpu.py" &
      stage kt_group_gemm 200 "python -m pytest -m gpu -q tests/gpu/test_group_gemm_gpu.py" &
      stage kt_host_bound 200 "python -m pytest -m gpu -q tests/gpu/test_host_bound_gpu.py" &
      wait ;;
    cutoff-tests) stage cutoff_tests 200 "python -m pytest -m gpu -q tests/gpu/test_cutoff_fused_gpu.py tests/gpu/test_cutoff_gpu.py" ;;
    cutoff-solvers) stage cutoff_solvers 200 "python bench/cutoff_solvers.py --out $OUT/cutoff_solvers.json" ;;
    cutoff-mpc) stage cutoff_mpc 150 "python bench/cutoff_mpc.py --out $OUT/cutoff_mpc.json --config $OUT/cutoff_decisions.json" ;;
    moe) stage moe 220 "python bench/moe.py --out $OUT/moe --quick" ;;
    bmm) stage bmm 150 "python bench/bmm.py --out $OUT/bmm --quick --budget-s 60" ;;
    kernel-tests2)  # the families merged after call A, side by side
      stage kt_group_gemm 200 "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_group_gemm_gpu.py" &
      stage kt_host_bound 200 "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_host_bound_gpu.py" &
      stage kt_glsm 200 "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_gemm_log_softmax_gpu.py" &
      stage kt_rnn 200 "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_rnn_gpu.py" &
      [ -f tests/gpu/test_conv_gpu.py ] && stage kt_conv 200 "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_conv_gpu.py" &
      wait ;;
    torchao) stage torchao 120 "python -m pip install -q --no-deps --no-index .stage/wheels/torchao-0.18.0-*.whl && python -c 'import torchao; print(torchao.__version__)'" ;;
    kernel-tests3)  # the fixes after call B, and the W8A8 families with torchao, side by side
      stage kt_bmm 200 "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_bmm_gpu.py" &
      stage kt_group_gemm 200 "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_group_gemm_gpu.py" &
      stage kt_scaled_mm 300 "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_scaled_mm_gpu.py tests/gpu/test_scaled_mm_torchao_gpu.py" &
      wait ;;
    scaled-e2e) stage scaled_e2e 150 "python -m pip install -q --no-deps --no-index .stage/wheels/torchao-0.18.0-*.whl; PYTHONPATH=src:. python bench/scaled_mm_e2e.py --out $OUT/scaled_mm_e2e.json" ;;
    scaled-quick) stage scaled_quick 260 "python bench/scaled_mm.py --quick --budget-s 120 --out $OUT/scaled_mm_quick.json" ;;
    tune-wall) stage tune_wall 200 "python bench/tune_wall.py --runs pool-cold,pool-warm --out $OUT/tune_wall.json" ;;
    glsm) stage glsm 150 "python bench/gemm_log_softmax.py --out $OUT/glsm --quick" ;;
    rnn) stage rnn 120 "python bench/rnn.py --out $OUT/rnn --quick" ;;
    conv) stage conv 150 "python bench/conv.py --out $OUT/conv --quick" ;;
    *) echo "unknown stage $s" ;;
  esac
done
tar -czf "$FINAL/logs.tgz" -C "$FINAL" logs && rm -rf "$OUT"
