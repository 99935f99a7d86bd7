#!/usr/bin/env bash
# One device call, several stages: `bash bench/device_session.sh STAGE...` on the H200.
# Logs and JSON land in $OUT (at most 8 files come back, so everything else is tarred).
# Stages: arch tests fidelity gemm prebuild census build evaluate host
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export TUNEDB_CACHE_DIR=${TUNEDB_CACHE_DIR:-/tmp/tunedb-cache} TUNEDB_USER_DB=${TUNEDB_USER_DB:-/tmp/tunedb-user}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/logs"
W=/tmp/work; mkdir -p $W
t0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t0 ))s] $*"; }
tunedb() { python -m tunedb "$@"; }
for stage in "$@"; do
  stamp "stage $stage"
  case "$stage" in
    env)
      nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
      python -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)";;
    arch)
      python -m tunedb.arch --measure --refresh --out "$OUT/arch_sm90.json" 2>&1 | tee "$OUT/logs/arch.log" ;;
    tests)
      python -m pytest -m gpu tests -q -x --timeout=900 -p no:cacheprovider 2>&1 | tee "$OUT/logs/gpu_tests.log" | tail -40 ;;
    fidelity)
      python bench/protocol_fidelity.py --out "$OUT/logs/fidelity.json" --md "$OUT/logs/fidelity.md" 2>&1 | tee "$OUT/logs/fidelity.log" ;;
    gemm)
      python bench/gemm_kernels.py --out "$OUT/logs/gemm_kernels.json" ${GEMM_ARGS:-} 2>&1 | tee "$OUT/logs/gemm_kernels.log" ;;
    host)
      python bench/host_overhead.py --out "$OUT/logs/host_overhead.json" 2>&1 | tee "$OUT/logs/host_overhead.log" ;;
    census)
      tunedb census whisper-base --out $W/wb.json
      tunedb census whisper-large-v3 --max-batch-size 8 --out $W/wl.json
      tunedb census conformer --mode streaming --chunk-size 16 --max-batch-size 32 --out $W/cs.json
      tunedb census llama-3-8b --mode decode --max-batch-size 64 --out $W/ld.json
      cp $W/*.json "$OUT/logs/" ;;
    build)
      for c in wb wl cs ld; do
        stamp "build $c"
        tunedb build --census $W/$c.json --out $W/sys --thin --max-points ${MAX_POINTS:-8} --run-id sys-$c 2>&1 | tee "$OUT/logs/build_$c.log" | tail -15
      done
      cp -r $W/sys "$OUT/logs/sys" ;;
    evaluate)
      tunedb evaluate --log $W/sys/measurements.jsonl --db system=$W/sys/sm90/gemm.json --census $W/wb.json --census $W/wl.json --census $W/cs.json --census $W/ld.json --png "$OUT/logs/eval.png" 2>&1 | tee "$OUT/logs/evaluate.log" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
stamp "done"
tar czf "$OUT/session.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"/sys
ls -la "$OUT"
