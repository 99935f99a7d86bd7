#!/usr/bin/env bash
# Session 17, issue 19: the linalg agreement under the sequential `--pick low` (now the CLI's
# default: lower quartiles, band max(2%, 150 ns a call), a cell near its band's edge measured in up
# to 5 blocks of 9 rounds, each on fresh CUDA graphs and buffers), and the shipped table re-tuned
# under it, in ONE call.
#   LOGS_TGZ=s17_linalg.tgz bash bench/device_s17_linalg.sh [STAGE...]   (repository root, on the device)
# Stages (default: all but goal, in this order):
#   prebuild  compile every kernel of the full grid at --max-arms 4 (15 jobs; 60-120 s cold)
#   agree     two tunes of the whole grid (ladder then solver, seeds 0 and 1, separate processes,
#             --max-arms 4 as the repro tunes), every sample recorded (each round's block), then
#             the comparison: the tables as tuned and the rules replayed (median, low, low-blocks),
#             and `blocks`: how far near-edge arms moved between captures inside one run (against
#             the 36-110 ns between processes). Expected 4 x 20-50 s = 100-170 s.
#   shipped   run a's table (the whole grid at 4 arms under the new rule) with potrf/posv n <= 32
#             re-tuned at --max-arms 14 (s15 E's 13 arms plus session 18's shfl config) on top, to $FINAL/db/sm90/linalg.json;
#             then bench/linalg_served.py on it (what it serves over torch, from its evidence).
#             Expected 80-140 s (about 200 more kernels to compile, 48 cells x 14 arms).
#   goal      python bench/linalg_ladder.py --goal (every arm and torch on the 48 goal cells in one
#             run; --budget-s GOAL_BUDGET_S, 120 by default): 120-160 s. Not in the default list.
# Expected total (default stages): 250-400 s. SKIP_AFTER_S=N skips every stage that would start
# after N s (cut order if short: goal, then shipped; agree alone is ~250 s with prebuild).
# Knobs: S17_ARMS (4), S17_SHIPPED_ARMS (14), S17_JOBS (15), S17_MAX_ROUNDS (45).
. "$(dirname "$0")/device_stages.sh"
record_env
T0=$(date +%s)
ARMS=${S17_ARMS:-4}
MAXR=${S17_MAX_ROUNDS:-45}
TUNE="python -m tunedb linalg tune --pick low --max-rounds $MAXR"
skip() {
  if [ -n "${SKIP_AFTER_S:-}" ] && [ $(( $(date +%s) - T0 )) -gt "$SKIP_AFTER_S" ]; then
    echo "[skip $1] $(( $(date +%s) - T0 )) s > SKIP_AFTER_S=$SKIP_AFTER_S"; return 0
  fi
  return 1
}
compare() {
  local a="$OUT/a_ladder.jsonl,$OUT/a_solver.jsonl" b="$OUT/b_ladder.jsonl,$OUT/b_solver.jsonl"
  echo "== all rounds (the tables as tuned, and each rule on the same samples)"
  python bench/linalg_pick_replay.py cross "$a" "$b" --rules median,low,low-blocks --out "$OUT/cross_all.json"
  echo "== each cell's first 9 rounds (one capture, no extra blocks)"
  python bench/linalg_pick_replay.py cross "$a" "$b" --rules median,low --first 9 --out "$OUT/cross_first9.json"
  echo "== between captures inside one run (near-edge arms of cells measured in 2+ blocks)"
  python bench/linalg_pick_replay.py blocks "$a" "$b" --out "$OUT/blocks.json"
  python -m tunedb diff "$OUT/a/sm90/linalg.json" "$OUT/b/sm90/linalg.json" > "$OUT/diff_ab.txt" 2>&1
  return 0
}
STAGES=${*:-prebuild agree shipped}
for s in $STAGES; do
  skip "$s" && continue
  case $s in
    prebuild) stage prebuild 150 "$TUNE --max-arms $ARMS --prebuild --build-jobs ${S17_JOBS:-15} --out $OUT/pre" ;;
    agree)
      stage ladder_a 90 "$TUNE --max-arms $ARMS --legs ladder --seed 0 --build-jobs 4 --samples $OUT/a_ladder.jsonl --out $OUT/a"
      stage ladder_b 90 "$TUNE --max-arms $ARMS --legs ladder --seed 1 --build-jobs 4 --samples $OUT/b_ladder.jsonl --out $OUT/b"
      stage solver_a 110 "$TUNE --max-arms $ARMS --legs solver --seed 0 --build-jobs 4 --samples $OUT/a_solver.jsonl --out $OUT/a"
      stage solver_b 110 "$TUNE --max-arms $ARMS --legs solver --seed 1 --build-jobs 4 --samples $OUT/b_solver.jsonl --out $OUT/b"
      compare > "$OUT/compare.log" 2>&1; echo "[stage compare] rc=$?"; grep -v "^ \{19\}" "$OUT/compare.log"; pack_logs ;;
    shipped)
      base=$OUT/a/sm90/linalg.json
      [ -f "$base" ] || base=src/tunedb/db/sm90/linalg.json  # without agree: on top of the shipped table
      stage shipped 170 "$TUNE --legs solver --ops potrf,posv --n 4,8,16,32 --max-arms ${S17_SHIPPED_ARMS:-14} --build-jobs ${S17_JOBS:-15} --samples $OUT/shipped.jsonl --base $base --out $FINAL/db/sm90/linalg.json && python bench/linalg_served.py --table $FINAL/db/sm90/linalg.json --out $OUT/served.json" ;;
    goal) stage goal $(( ${GOAL_BUDGET_S:-120} + 60 )) "python bench/linalg_ladder.py --goal --budget-s ${GOAL_BUDGET_S:-120} --out $OUT/goal.json" ;;
    *) echo "unknown stage $s" ;;
  esac
done
echo "[device_s17_linalg] done in $(( $(date +%s) - T0 )) s"
pack_logs
