#!/usr/bin/env bash
# Session 13's linalg device call (issue 19: potrf/posv n <= 32 at >= 10x over torch), stages by
# name, each under its own timeout, logs under $OUT/logs (packed into $OUT/logs.tgz), the rebuilt
# table under $OUT/db/.
#   bash bench/device_s13_linalg.sh goal retune tests   (from the repository root; worst case 600 s
#   by the timeouts, expected 6-7 minutes; `retune` runs `served` on its table)
# goal    (<= 170 s; expect 100-150): the 48 goal cells (potrf, posv x n 4,8,16,32 x batch 256,
#         4096, 65536 x fp32, fp64), old packings, lane and reg packings, torch and the checked torch
#         forms in one run: CUDA graphs over a ring of fresh inputs, 9 shuffled rounds, medians; per
#         cell ns/problem, x over torch, x over max(floor, 3 us), best old vs best lane vs best reg,
#         the geomeans (with and without reg).
# retune  (<= 260 s in two stages of <= 130 s, fp32 then fp64; expect 60-110 s each): re-measure
#         the shipped table's potrf/posv cells at n <= 32 (tune --ops potrf,posv --n 4,8,16,32
#         --max-arms 11 over the shipped table: the old 9 plus two reg configs where reg runs;
#         every other cell kept), written to
#         $OUT/db/linalg.json (copy it over src/tunedb/db/sm90/linalg.json), then `served` reads it.
# served  (CPU, seconds): what the rebuilt table serves on the goal cells, from its evidence.
# tests   (<= 140 s; expect 60-110): tests/gpu/test_linalg_lane_gpu.py and test_linalg_reg_gpu.py.
STAGE_TAIL=25
. "$(dirname "$0")/device_stages.sh"
record_env
for s in "$@"; do
  case $s in
    goal) stage goal ${GOAL_S:-170} "python bench/linalg_ladder.py --goal --budget-s ${GOAL_BUDGET:-150} --out $OUT/linalg_goal.json" ;;
    retune)  # fp32 then fp64, each its own stage: a stage killed by its timeout writes nothing,
      # and the other dtype's cells still land (the second starts from the first's table)
      stage retune_fp32 ${RETUNE_S:-130} "python -m tunedb linalg tune --legs solver --ops potrf,posv --dtypes fp32 --n 4,8,16,32 --max-arms ${RETUNE_ARMS:-11} --base src/tunedb/db/sm90/linalg.json --out $FINAL/db/linalg.json"
      [ -f $FINAL/db/linalg.json ] && BASE=$FINAL/db/linalg.json || BASE=src/tunedb/db/sm90/linalg.json
      stage retune_fp64 ${RETUNE_S:-130} "python -m tunedb linalg tune --legs solver --ops potrf,posv --dtypes fp64 --n 4,8,16,32 --max-arms ${RETUNE_ARMS:-11} --base $BASE --out $FINAL/db/linalg.json"
      stage served 30 "python bench/linalg_served.py --table $FINAL/db/linalg.json --out $OUT/linalg_served.json" ;;
    served) stage served 30 "python bench/linalg_served.py --table ${TABLE:-$FINAL/db/linalg.json} --out $OUT/linalg_served.json" ;;
    tests) stage lane_tests ${TESTS_S:-140} "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_linalg_lane_gpu.py tests/gpu/test_linalg_reg_gpu.py" ;;
    *) echo "unknown stage $s" ;;
  esac
done
pack_logs
