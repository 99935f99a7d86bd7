#!/usr/bin/env bash
# Session 14's block-scaled fp8 device call (issue 20): stages by name, each under its own timeout,
# logs packed into $OUT/logs.tgz (LOGS_TGZ), rebuilt tables copied to $OUT/db/.
#   bash bench/device_s14_fp8.sh [STAGE...]   (from the repository root; no STAGE: fp8-block-verdict)
# fp8-block-verdict  one stage, ~150-200 s expected, 300 s at most (its three timeouts: 60 + 100 + 140 s):
#   1. compiles the whole block-valid space (bench/fp8_block_exhaustive.py's compile step, 8 jobs,
#      into the Triton cache the build and the sweep then read; ~25 s);
#   2. rebuilds the block-scaled entries of the shipped fp8 table (`tunedb build --out system`,
#      merged, --top-k 16: the pruning model's top 16 plus pruning.BLOCK_SEEDS, 304 arms + 38
#      cross-evaluated, ~60 s) and copies it to $OUT/db/. --tie-band 0.01 (BLOCK_TIE): the family's
#      3% band let the session 13 table sit up to 2.2% off its own build's best (4 of 14 points
#      over 1%; replayed at 0.01: 0.3%), which leaves no margin under a 3% goal;
#   3. measures that table against the exhaustive sweep of the block-valid space at every census
#      point (bench/fp8_block_exhaustive.py, pass 1 screen + pass 2 re-timing; ~90 s), printing
#      table / best per point, the worst, the geomean and heuristic / table, and why a pick misses
#      (from the build's log, kept as logs/block_measurements.jsonl.gz); JSON in logs.tgz.
. "$(dirname "$0")/device_stages.sh"
record_env
CENSUS=bench/census/quant_llama_fp8-block.json
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$HOME/.cache/tunedb/triton}
STAGES=${*:-fp8-block-verdict}
for s in $STAGES; do
  case $s in
    fp8-block-verdict)
      RID=s14-fp8-block-$(date +%s)  # a fresh run id: a reused one would resume, measuring nothing
      BLOG=${TUNEDB_CACHE_DIR:-$HOME/.cache/tunedb}/runs/$RID/measurements.jsonl
      stage fp8_block_compile 60 "python -c 'import sys; sys.path.insert(0, \"bench\"); import fp8_block_exhaustive as b; print(round(b.compile_all(b.block_space(), 8), 1), \"s\")'"
      stage fp8_build_block 100 "python -m tunedb build --family scaled_mm_fp8 --out system --no-fill --top-k ${BLOCK_K:-16} --tie-band ${BLOCK_TIE:-0.01} --run-id $RID --census $CENSUS"
      BUILD_LOG=""
      if [ -s "$BLOG" ]; then  # the build wrote its table and log: bring both back
        cp src/tunedb/db/sm90/scaled_mm_fp8.json "$FINAL/db/"
        gzip -c "$BLOG" > "$LOGS/block_measurements.jsonl.gz"; BUILD_LOG="--build-log $LOGS/block_measurements.jsonl.gz"
      else echo "no build log at $BLOG: the table is not copied back"; fi
      stage fp8_block_exhaustive 140 "python bench/fp8_block_exhaustive.py --census $CENSUS --jobs 1 --budget-s 95 $BUILD_LOG --out $OUT/fp8_block_exhaustive.json" ;;
    *) echo "unknown stage $s" ;;
  esac
done
pack_logs
