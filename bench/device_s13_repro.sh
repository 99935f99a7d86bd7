#!/usr/bin/env bash
# Session 13, issue 19's last goal: "two re-measurements in one call agree on >= 98% of cells, and
# every disagreement lies inside the tie band". The linalg table regenerated twice in ONE call
# (runs a and b, separate processes, shuffle seeds 0 and 1), every raw sample recorded, then
# compared cell by cell on the CPU: the tables as tuned, and every pick rule replayed on the same
# samples (the median rule on each cell's first 9 rounds is what session 9 shipped).
#   bash bench/device_s13_repro.sh [STAGE...]   (on the device, from the repository root)
# Stages (default all, in this order): prebuild ladder-a ladder-b solver-a solver-b compare seed-check.
# seed-check (issue 19, session 16): the dot cells again in a third process with run a's seed (the
# same shuffle order and ring inputs), compared with a and b: if c agrees with a where b does not,
# the seed (order, inputs) moves the launch-floor cells; if not, the process does (~15 s).
# The ladder leg (dot, gemv, gemm: 108 cells, where 14 of session 9's 17 moves were) is measured by
# both runs before the solver leg (potrf, trsv, posv: 108 cells), so if the budget runs out the
# ladder comparison is complete. Every stage runs under `timeout`, capped by what is left of
# REPRO_BUDGET_S (300 s); a stage with under 10 s left is skipped and says so.
# Knobs: REPRO_ARMS (--max-arms, 4 as the shipped table), REPRO_PICK (low|paired|median; low since
#   session 16: lower quartiles, the band widened to REPRO_JITTER_NS a call), REPRO_JITTER_NS (150),
#   REPRO_MAX_ROUNDS (45: extra rounds, 9 at a time, only while a cell is ambiguous (paired,
#   median) or a burst took > 40% of an arm's samples or the pick sits near its band's edge (low:
#   each further block on fresh CUDA graphs, session 17)), REPRO_DTYPES.
# The samples files keep each round's time, order and the GPU's SM clock and throttle reasons.
# Expected: prebuild 60-120 s (263 kernels, cold Triton cache), each ladder leg 20-35 s, each
#   solver leg 35-60 s, compare < 5 s, seed-check 15-40 s: about 215-300 s (REPRO_BUDGET_S caps it;
#   seed-check is the first to be skipped).
. "$(dirname "$0")/device_stages.sh"
record_env
BUDGET=${REPRO_BUDGET_S:-300}
T0=$(date +%s)
ARMS=${REPRO_ARMS:-4}
PICK=${REPRO_PICK:-low}
JIT=${REPRO_JITTER_NS:-150}
MAXR=${REPRO_MAX_ROUNDS:-45}
DT=${REPRO_DTYPES:-fp32,fp64}
TUNE="python -m tunedb linalg tune --max-arms $ARMS --dtypes $DT --pick $PICK --launch-jitter-ns $JIT --max-rounds $MAXR"
stage() {  # name cap_s command... (device_stages.sh's, capped by what is left of BUDGET)
  local name=$1 cap=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - T0) - 5 ))  # 5 s kept for the comparison
  [ "$name" = compare ] && left=$(( left + 5 ))
  local t=$(( cap < left ? cap : left ))
  if [ "$t" -lt 10 ]; then echo "[stage $name] skipped: ${left} s of the ${BUDGET} s budget left"; return; fi
  local t0=$(date +%s)
  echo "[stage $name] start $(date -u +%T) (timeout $t s)"
  timeout "$t" bash -c "$*" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "[stage $name] rc=$rc in $(( $(date +%s) - t0 )) s"
  tail -n 4 "$OUT/$name.log"
  pack_logs
}
compare() {  # every run's samples present so far, both ways: as tuned (all rounds) and first 9 rounds
  local a b
  a=$(ls "$OUT"/a_*.jsonl 2>/dev/null | paste -sd, -)
  b=$(ls "$OUT"/b_*.jsonl 2>/dev/null | paste -sd, -)
  [ -n "$a" ] && [ -n "$b" ] || { echo "no samples of both runs"; return 1; }
  echo "== all rounds (the tables as tuned, and each rule on the same samples)"
  python bench/linalg_pick_replay.py cross "$a" "$b" --jitter-ns "$JIT" --out "$OUT/cross_all.json"
  echo "== each cell's first 9 rounds (a run without extra rounds)"
  python bench/linalg_pick_replay.py cross "$a" "$b" --jitter-ns "$JIT" --first 9 --out "$OUT/cross_first9.json"
  python -m tunedb diff "$OUT/a/sm90/linalg.json" "$OUT/b/sm90/linalg.json" > "$OUT/diff_ab.txt" 2>&1
  return 0
}
seed_check() {  # run c (seed 0, dot only) against a and against b, on the dot cells
  local a=$OUT/a_ladder.jsonl b=$OUT/b_ladder.jsonl c=$OUT/c_ladder.jsonl
  [ -f "$a" ] && [ -f "$b" ] && [ -f "$c" ] || { echo "seed-check: missing samples"; return 1; }
  echo "== a (seed 0) vs c (seed 0, another process), dot"
  python bench/linalg_pick_replay.py cross "$a" "$c" --ops dot --jitter-ns "$JIT" --out "$OUT/cross_ac.json"
  echo "== b (seed 1) vs c (seed 0), dot"
  python bench/linalg_pick_replay.py cross "$b" "$c" --ops dot --jitter-ns "$JIT" --out "$OUT/cross_bc.json"
}
STAGES=${*:-prebuild ladder-a ladder-b solver-a solver-b compare seed-check}
for s in $STAGES; do
  case $s in
    prebuild) stage prebuild 150 "$TUNE --prebuild --build-jobs ${REPRO_JOBS:-15} --out $OUT/pre" ;;  # --out: the user tier is off
    ladder-a) stage ladder_a 90 "$TUNE --legs ladder --seed 0 --build-jobs 4 --samples $OUT/a_ladder.jsonl --out $OUT/a" ;;
    ladder-b) stage ladder_b 90 "$TUNE --legs ladder --seed 1 --build-jobs 4 --samples $OUT/b_ladder.jsonl --out $OUT/b" ;;
    solver-a) stage solver_a 110 "$TUNE --legs solver --seed 0 --build-jobs 4 --samples $OUT/a_solver.jsonl --out $OUT/a" ;;
    solver-b) stage solver_b 110 "$TUNE --legs solver --seed 1 --build-jobs 4 --samples $OUT/b_solver.jsonl --out $OUT/b" ;;
    compare) compare > "$OUT/compare.log" 2>&1; echo "[stage compare] rc=$?"; cat "$OUT/compare.log" ;;
    seed-check)
      stage ladder_c 40 "$TUNE --legs ladder --ops dot --seed 0 --build-jobs 4 --samples $OUT/c_ladder.jsonl --out $OUT/c"
      seed_check > "$OUT/seed_check.log" 2>&1; echo "[stage seed-check] rc=$?"; grep -v "^ \{19\}" "$OUT/seed_check.log" ;;
    *) echo "unknown stage $s" ;;
  esac
done
echo "total $(( $(date +%s) - T0 )) s"
pack_logs
