#!/usr/bin/env bash
# Session 12's and 13's device calls: stages by name, each under its own timeout, logs under $OUT.
#   bash bench/device_s12.sh STAGE...   (run on the device from the repository root)
# scaling: SCALE_RUNS (1,2,2k), SCALE_P (points per signature, 0 = all), SCALE_K (top-k), SCALE_KILL (s),
#   SCALE_GATE (--gate-noise), SCALE_EXTRA (more build_scaling flags, e.g. a second --census)
# GPU test files that only check kernels run side by side (their Triton compiles are CPU-bound);
# anything timed, and anything with the protocol's busy-GPU refusal, runs alone.
. "$(dirname "$0")/device_stages.sh"
record_env
for s in "$@"; do
  case $s in
    ray)  # Ray for the actors (bench/ray_carry.sh's tarball, carried in .stage/)
      stage ray 60 "mkdir -p /tmp/ray312 && tar -xJf .stage/ray312.tar.xz -C /tmp/ray312 && PYTHONPATH=/tmp/ray312:src python -c 'import ray; ray.init(include_dashboard=False, log_to_driver=False); print(ray.__version__, ray.cluster_resources()); ray.shutdown()'"
      export PYTHONPATH=/tmp/ray312:src ;;
    prebuild-llama)  # both builds of the scaling run start from one warm cache (compiling is never timed)
      stage prebuild_llama ${PB_S:-150} "python -m tunedb prebuild --census bench/census/llama-3-8b_decode.json $([ "${SCALE_P:-6}" = 0 ] || echo --thin --max-points ${SCALE_P:-6}) --jobs ${PB_JOBS:-24}" ;;
    scaling)  # issue 26: 1 GPU, 2 GPUs, 2 GPUs with one actor SIGKILLed, at the same points
      stage scaling ${SCALE_S:-420} "python bench/build_scaling.py --workers ${SCALE_RUNS:-1,2,2k} --max-points ${SCALE_P:-6} --top-k ${SCALE_K:-4} --kill-after ${SCALE_KILL:-25} ${SCALE_GATE:+--gate-noise $SCALE_GATE} ${SCALE_EXTRA:-} --out $OUT/scaling && for d in $OUT/scaling/w*/; do f=\$(basename \$d); python -m tunedb diff $OUT/scaling/w1/sm90/gemm.json \$d/sm90/gemm.json > $OUT/scaling/diff_\$f.txt 2>&1; done; true" ;;
    workers-test) stage workers_test 200 "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_build_workers_gpu.py" ;;
    cutoff-mpc) stage cutoff_mpc 150 "python bench/cutoff_mpc.py --out $OUT/cutoff_mpc.json --config $OUT/cutoff_decisions.json" ;;
    cutoff-tests) stage cutoff_tests 200 "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_cutoff_fused_gpu.py tests/gpu/test_cutoff_gpu.py" ;;
    e2e-llama) stage e2e_llama ${E2E_S:-260} "python bench/e2e.py --models llama-3-8b --batches 1,16 --budget-s ${E2E_BUDGET:-240} --out $OUT/e2e_llama.json" ;;
    tune-wall-ab)  # the default pool and an 8-process pool, cold, one after the other
      stage tune_wall 200 "python bench/tune_wall.py --runs pool-cold,pool-warm --out $OUT/tune_wall.json"
      stage tune_wall_j8 120 "python bench/tune_wall.py --runs pool-cold --compile-jobs 8 --out $OUT/tune_wall_j8.json" ;;
    tune-wall2) stage tune_wall2 160 "python bench/tune_wall.py --runs pool-cold,pool-warm --repeat 2 --out $OUT/tune_wall2.json" ;;
    tune-wall3)  # issue 22: default, TUNEDB_MEASURE_AHEAD=1, TUNEDB_CENSUS_BESIDE=1, interleaved, TW_REPEAT rounds
      for r in $(seq 1 ${TW_REPEAT:-2}); do
        stage tune_wall_default_$r 120 "python bench/tune_wall.py --runs pool-cold,pool-warm --out $OUT/tune_wall_default_$r.json"
        stage tune_wall_ahead_$r 120 "TUNEDB_MEASURE_AHEAD=1 python bench/tune_wall.py --runs pool-cold,pool-warm --no-prewarm --out $OUT/tune_wall_ahead_$r.json"
        stage tune_wall_beside_$r 120 "TUNEDB_CENSUS_BESIDE=1 python bench/tune_wall.py --runs pool-cold,pool-warm --no-prewarm --out $OUT/tune_wall_beside_$r.json"
        stage tune_wall_both_$r 120 "TUNEDB_MEASURE_AHEAD=1 TUNEDB_CENSUS_BESIDE=1 python bench/tune_wall.py --runs pool-cold,pool-warm --no-prewarm --out $OUT/tune_wall_both_$r.json"
      done ;;
    tune-wall) stage tune_wall 200 "python bench/tune_wall.py --runs pool-cold,pool-warm --out $OUT/tune_wall.json" ;;
    torchao) stage torchao 120 "python -m pip install -q --no-deps --no-index .stage/wheels/torchao-0.18.0-*.whl && python -c 'import torchao; print(torchao.__version__)'" ;;
    scaled-build)  # the shipped W8A8 tables (docs/scaled_mm.md), copied back under logs/db
      stage scaled_build_fp8 ${FP8_S:-300} "python -m tunedb build --family scaled_mm_fp8 --out system --no-fill --top-k 8 --fresh --census bench/census/quant_llama_fp8-rowwise.json --census bench/census/quant_llama_fp8-block.json && mkdir -p $OUT/db && cp src/tunedb/db/sm90/scaled_mm_fp8*.json $OUT/db/"
      stage scaled_build_int8 ${INT8_S:-240} "python -m tunedb build --family scaled_mm --out system --no-fill --top-k 8 --fresh --census bench/census/quant_llama_int8.json && mkdir -p $OUT/db && cp src/tunedb/db/sm90/scaled_mm*.json $OUT/db/" ;;
    scaled-e2e) stage scaled_e2e 180 "PYTHONPATH=src:. python bench/scaled_mm_e2e.py --out $OUT/scaled_mm_e2e.json" ;;
    scaled-quick) stage scaled_quick 260 "python bench/scaled_mm.py --quick --budget-s 120 --out $OUT/scaled_mm_quick.json" ;;
    bmm) stage bmm 150 "python bench/bmm.py --out $OUT/bmm --quick --budget-s 60" ;;
    moe) stage moe 220 "python bench/moe.py --out $OUT/moe --quick" ;;
    conv) stage conv 150 "python bench/conv.py --out $OUT/conv --quick" ;;
    glsm) stage glsm 150 "python bench/gemm_log_softmax.py --out $OUT/glsm --quick" ;;
    lsm-probe) stage lsm_probe 120 "python bench/lsm_probe.py --out $OUT/lsm" ;;
    rnn) stage rnn 120 "python bench/rnn.py --out $OUT/rnn --quick" ;;
    decode-limit) stage decode_limit 200 "python bench/decode_limit.py --out $OUT/decode_limit.json" ;;
    gpu-tests)  # GPU_TESTS="file1 file2 ..." side by side (kernel tests only: compile-bound)
      for f in ${GPU_TESTS:-}; do n=$(basename $f .py); stage kt_$n ${KT_S:-220} "python -m pytest -m gpu -q -rf --tb=short $f" & done
      wait ;;
    *) echo "unknown stage $s" ;;
  esac
done
pack_logs
