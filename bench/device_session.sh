#!/usr/bin/env bash
# One device call, several stages: `bash bench/device_session.sh STAGE...` on the H200.
# Every stage logs under /tmp/work/logs, re-tarred into $OUT/session.tgz after each stage, so a
# call stopped at its limit still returns what finished (at most 8 files come back from $OUT).
# Stages: env arch prebuilt tests fidelity gemm host selection tuneprofile profile inmodel censusdev build buildall repro exhaustive evaluate e2e e2e-each
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export TUNEDB_CACHE_DIR=${TUNEDB_CACHE_DIR:-/tmp/tunedb-cache} TUNEDB_USER_DB=${TUNEDB_USER_DB:-/tmp/tunedb-user}
OUT=${OUT:-/tmp/out}; W=/tmp/work; L=$W/logs; mkdir -p "$L" "$OUT"
CENSUS=${CENSUS:-"whisper-base_offline whisper-large-v3_offline conformer_streaming llama-3-8b_decode"}
# the system tier: both the aten-level censuses and those of tunedb.optimize(model) (gemm_act keys)
SYSTEM_CENSUS=${SYSTEM_CENSUS:-"$CENSUS $(for c in $CENSUS; do printf '%s_fused ' "$c"; done)"}
system_census_args() { args=(); for c in $SYSTEM_CENSUS; do args+=(--census bench/census/$c.json); done; }
t0=$(date +%s)
# the carried prebuilt cache (xz, smaller, or gzip), extracted afresh every call: on a machine kept
# warm between calls, an earlier call's compiles would otherwise sit in it
if [ -f .carry/triton-sys.txz ]; then rm -rf .carry/triton-sys; tar xJf .carry/triton-sys.txz -C .carry
elif [ -f .carry/triton-sys.tgz ]; then rm -rf .carry/triton-sys; tar xzf .carry/triton-sys.tgz -C .carry; fi
if [ -d .carry/triton-sys ]; then export TRITON_CACHE_DIR="$PWD/.carry/triton-sys"; fi
stamp() { echo "=== [$(( $(date +%s) - t0 ))s] $*" | tee -a "$L/stages.log"; }
tunedb() { python -m tunedb "$@"; }
for stage in "$@"; do
  stamp "stage $stage"
  case "$stage" in
    env)
      nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>&1 | tee "$L/env.log"
      python -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)" 2>&1 | tee -a "$L/env.log" ;;
    arch)
      timeout 120 python -m tunedb.arch --measure --refresh --out "$L/arch_sm90.json" 2>&1 | tee "$L/arch.log" ;;
    prebuilt)  # the carried Triton 3.6 cache (tunedb prebuild on the CPU machine): relocate, then prove
      if [ -d .carry/triton-sys ]; then
        timeout 120 python bench/prebuild_proof.py 2>&1 | tee "$L/prebuild_proof.log"
      else echo "no carried cache" | tee "$L/prebuild_proof.log"; fi ;;
    tests)
      timeout ${TESTS_S:-240} python -m pytest -m gpu tests -q -p no:cacheprovider 2>&1 | tee "$L/gpu_tests.log" | tail -30 ;;
    fidelity)
      timeout 120 python bench/protocol_fidelity.py --out "$L/fidelity.json" --md "$L/fidelity.md" 2>&1 | tee "$L/fidelity.log" | tail -40 ;;
    gemm)
      timeout 300 python bench/gemm_kernels.py --out "$L/gemm_kernels.json" ${GEMM_ARGS:-} 2>&1 | tee "$L/gemm_kernels.log" | tail -60 ;;
    host)
      timeout ${HOST_S:-150} python bench/host_overhead.py --out "$L/host_overhead.json" 2>&1 | tee "$L/host_overhead.log" ;;
    selection)  # the eager hit path's parts, and its paired selection cost
      timeout 120 python bench/selection_cost.py --out "$L/selection_cost.json" 2>&1 | tee "$L/selection_cost.log" ;;
    tuneprofile)  # where a tune's measuring time goes: worker start, probes, prepare, rounds (cProfile)
      timeout ${TUNEPROF_S:-240} python bench/tune_profile.py --log ${TUNEPROF_LOG:-bench/results/2026-11-30_s8_V1_tune_whisper-b8.jsonl.gz} --out "$L/tune_profile.json" 2>&1 | tee "$L/tune_profile.log" | tail -80 ;;
    profile)  # where an eager forward's host time goes, plain vs tunedb; MODEL:BATCH[:PINNED_CONFIG]
      for mb in ${PROFILE_MODELS:-llama-3-8b:1 whisper-large-v3:1}; do
        IFS=: read -r pm pb pc <<< "$mb"
        echo "### profile $mb" | tee -a "$L/profile_eager.log"
        timeout 150 python bench/profile_eager.py --model $pm --batch $pb ${pc:+--pin $pc} --iters ${PROFILE_ITERS:-200} ${PROFILE_ARGS:-} 2>&1 | tee -a "$L/profile_eager.log" | head -40
      done ;;
    inmodel)  # each kernel's GPU time inside a model, plain vs tunedb; INMODEL_RUNS: argument lists split by ";"
      IFS=';' read -ra runs <<< "${INMODEL_RUNS:---model whisper-large-v3 --batch 8 --graph}"
      for r in "${runs[@]}"; do
        echo "### inmodel $r" | tee -a "$L/inmodel.log"
        timeout ${INMODEL_S:-150} python bench/inmodel_kernels.py $r 2>&1 | tee -a "$L/inmodel.log" | tail -45
      done ;;
    censusdev)  # issue 5: a census on meta tensors equals the census run on the GPU
      timeout 240 python bench/census_devices.py --device cuda --presets ${CENSUSDEV_PRESETS:-whisper-base conformer llama-3-8b} 2>&1 | tee "$L/census_devices.log" ;;
    build)
      for c in $CENSUS; do
        stamp "build $c"
        timeout ${BUILD_S:-150} python -m tunedb build --census bench/census/$c.json --out $W/sys --thin --max-points ${MAX_POINTS:-8} --run-id sys-$c 2>&1 | tee "$L/build_$c.log" | tail -12
        cp $W/sys/sm90/gemm.json "$L/gemm_sm90.json" 2>/dev/null; cp $W/sys/measurements.jsonl "$L/" 2>/dev/null
        tar czf "$OUT/session.tgz" -C $W logs
      done ;;
    buildall)  # every preset census in ONE build: signatures shared by censuses get all their points
      system_census_args
      timeout ${BUILD_S:-240} python -m tunedb build "${args[@]}" --out $W/sys --thin --max-points ${MAX_POINTS:-8} --run-id sys-all 2>&1 | tee "$L/build_all.log" | tail -14
      cp $W/sys/sm90/gemm.json "$L/gemm_sm90.json"; cp $W/sys/measurements.jsonl "$L/"
      cp $W/sys/sm90/gemm.json src/tunedb/db/sm90/gemm.json ;;  # later stages (e2e) serve it
    repro)  # issue 5: two builds of one census in one call; count byte-identical regions
      c=${REPRO_CENSUS:-whisper-base_offline}
      for r in 1 2; do
        timeout ${BUILD_S:-150} python -m tunedb build --census bench/census/$c.json --out $W/repro$r --thin --max-points ${MAX_POINTS:-8} --run-id repro$r-$c 2>&1 | tail -3
      done
      python bench/region_agreement.py $W/repro1/sm90/gemm.json $W/repro2/sm90/gemm.json 2>&1 | tee "$L/repro.log"
      python -m tunedb diff $W/repro1/sm90/gemm.json $W/repro2/sm90/gemm.json 2>&1 | tee -a "$L/repro.log" ;;
    exhaustive)  # a true oracle: every valid config at every (thinned) point of one census
      c=${EXH_CENSUS:-whisper-base_offline}
      timeout ${EXH_S:-400} python -m tunedb build --census bench/census/$c.json --out $W/oracle --exhaustive --thin --max-points ${EXH_POINTS:-4} --run-id oracle-$c 2>&1 | tee "$L/exhaustive.log" | tail -6
      cp $W/oracle/measurements.jsonl "$L/oracle_measurements.jsonl"
      python -m tunedb evaluate --log $W/oracle/measurements.jsonl --db system=src/tunedb/db/sm90/gemm.json --census bench/census/$c.json --png "$L/oracle_eval.png" 2>&1 | tee "$L/oracle_evaluate.log" | tail -20 ;;
    evaluate)
      system_census_args
      timeout 120 python -m tunedb evaluate --log $W/sys/measurements.jsonl --db system=$W/sys/sm90/gemm.json "${args[@]}" --png "$L/eval.png" 2>&1 | tee "$L/evaluate.log" | tail -40 ;;
    e2e)
      timeout ${E2E_S:-480} python bench/e2e.py --out "$L/e2e.json" --md "$L/e2e.md" ${E2E_ARGS:-} 2>&1 | tee "$L/e2e.log" | tail -60 ;;
    e2e-each)  # one e2e invocation per model, each with its own budget, so max-autotune fits for every model (E2E_ARGS: extra flags, e.g. --compile-cdt --tune-in-process)
      for m in ${E2E_MODELS:-whisper-large-v3 llama-3-8b conformer}; do
        timeout ${E2E_S:-280} python bench/e2e.py --models $m --budget-s ${E2E_BUDGET:-250} ${E2E_BATCHES:+--batches $E2E_BATCHES} ${E2E_ARGS:-} --work "$W/e2e_$m" --out "$L/e2e_$m.json" --md "$L/e2e.md" 2>&1 | tee "$L/e2e_$m.log" | tail -25
        # the tune's own evidence (its tier and measurement log), to set beside the in-model rows
        cp "$W/e2e_$m/user/sm90/gemm.json" "$L/e2e_${m}_tuned_gemm.json" 2>/dev/null
        gzip -c "$W/e2e_$m/user/measurements.jsonl" > "$L/e2e_${m}_tune_measurements.jsonl.gz" 2>/dev/null
        tar czf "$OUT/session.tgz" -C $W logs
      done ;;
    *) echo "unknown stage $stage" ;;
  esac
  tar czf "$OUT/session.tgz" -C $W logs
done
stamp "done"
tar czf "$OUT/session.tgz" -C $W logs
