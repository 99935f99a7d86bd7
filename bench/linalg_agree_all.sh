#!/usr/bin/env bash
# Issue 19's agreement goal on the whole grid, in ONE device call: the linalg table regenerated
# twice (seeds 0 and 1, separate processes, the shipped settings: --pick low --max-rounds 45, the
# CUDA tier in the ladder, AGREE_ARMS Triton configs a cell, default 4 as session 17's repro
# tunes), every raw sample recorded, then the picks compared: the tables as tuned and the rules
# replayed on the same samples (bench/linalg_pick_replay.py cross), how far near-edge arms moved
# between captures (blocks), and `tunedb diff` of the two tables.
#   OUT=/tmp/x bash bench/linalg_agree_all.sh        (repository root, on the device)
# Order: prebuild (every kernel of both tunes, 15 jobs), ladder a, ladder b, solver a, solver b,
# compare; each step under its own timeout, so a cut call still compares the legs it finished.
set -u
OUT=${OUT:?OUT is where the tables and samples go}
export PYTHONPATH=${PYTHONPATH:-src} TUNEDB_USER_DB=off
# AGREE_TUNE_ARGS: more tune flags for both runs (session 40: --keep src/tunedb/db/sm90/linalg.json,
# both tunes starting from the shipped table, as a re-tune of it would)
TUNE="python -m tunedb linalg tune --pick low --max-rounds 45 --max-arms ${AGREE_ARMS:-4} ${AGREE_TUNE_ARGS:-}"
T0=$(date +%s)
step() {  # name timeout command...
  local name=$1 t=$2; shift 2
  local t1=$(date +%s)
  timeout "$t" bash -c "$*" > "$OUT/$name.log" 2>&1
  echo "[$name] rc=$? in $(( $(date +%s) - t1 )) s (call at $(( $(date +%s) - T0 )) s)"
  tail -n 3 "$OUT/$name.log"
}
step prebuild "${AGREE_PREBUILD_S:-150}" "$TUNE --prebuild --build-jobs 15 --out $OUT/pre"
for leg in ladder solver; do
  for run in a b; do
    seed=0; [ "$run" = b ] && seed=1
    step "${leg}_$run" "${AGREE_LEG_S:-240}" "$TUNE --legs $leg --seed $seed --build-jobs 15 --samples $OUT/${run}_$leg.jsonl --out $OUT/$run"
  done
done
runs() { local f="" s; for s in ladder solver; do [ -s "$OUT/${1}_$s.jsonl" ] && f="$f${f:+,}$OUT/${1}_$s.jsonl"; done; echo "$f"; }
{
  echo "== all rounds (the tables as tuned, and each rule on the same samples)"
  python bench/linalg_pick_replay.py cross "$(runs a)" "$(runs b)" --rules median,low,low-blocks --out "$OUT/cross_all.json"
  echo "== between captures inside one run (near-edge arms of cells measured in 2+ blocks)"
  python bench/linalg_pick_replay.py blocks "$(runs a)" "$(runs b)" --out "$OUT/blocks.json"
  echo "== tunedb diff a b"
  python -m tunedb diff "$OUT/a/sm90/linalg.json" "$OUT/b/sm90/linalg.json"
} > "$OUT/compare.log" 2>&1
grep -v "^ \{19\}" "$OUT/compare.log" | head -60
gzip -f "$OUT"/*.jsonl 2>/dev/null
echo "[agree-all] done in $(( $(date +%s) - T0 )) s"
