#!/usr/bin/env bash
# Session 13's tune-cold stage (issue 22: cold `tunedb tune whisper-base` <= 30 s, warm <= 15 s).
#   bash bench/device_s13_tune.sh profile-test tune-cold   (on the device, from the repository root;
#   about 15 s + 170 s)
# profile-test: the arch profile measured in the measuring worker (what a cold tune now does beside
# its census), tests/gpu/test_profile_in_worker_gpu.py.
# Interleaved, TW_REPEAT rounds (2): the new default (TUNEDB_MEASURE_AHEAD on, the speculative
# plan submitted before the arch profile is measured) cold then warm, and TUNEDB_MEASURE_AHEAD=0
# cold (the old default's measuring; the earlier submit cannot be turned off), the order swapped
# in the second round. Every run prints its timeline (TUNEDB_TIMELINE=1, bench/tune_wall.py):
# read "mirror plan", "last compile done", "census end", "ahead first point" off the JSON.
. "$(dirname "$0")/device_stages.sh"
record_env
for s in "$@"; do
  case $s in
    profile-test) stage profile_test 60 "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_profile_in_worker_gpu.py" ;;
    tune-cold)
      new() { stage tune_new_$1 100 "python bench/tune_wall.py --runs pool-cold,pool-warm $2 --out $OUT/tune_new_$1.json"; }
      old() { stage tune_old_$1 75 "TUNEDB_MEASURE_AHEAD=0 python bench/tune_wall.py --runs pool-cold $2 --out $OUT/tune_old_$1.json"; }
      for r in $(seq 1 ${TW_REPEAT:-2}); do
        if [ $((r % 2)) = 1 ]; then new $r "$([ $r = 1 ] || echo --no-prewarm)"; old $r --no-prewarm
        else old $r --no-prewarm; new $r --no-prewarm; fi
      done
      python - "$OUT" <<'PY' 2>&1 | tee "$OUT/tune_cold_summary.txt"
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "tune_*_[0-9]*.json"))):
    for name, r in json.load(open(f))["runs"].items():
        tl = r.get("timeline", {})
        print(f"{os.path.basename(f):<18}{name:<11} wall {r['wall_s']:>5} s  census {r['census_s']}  ahead {r.get('ahead')}  "
              + ", ".join(f"{k} {v}" for k, v in tl.items()))
PY
      ;;
    *) echo "unknown stage $s" ;;
  esac
done
pack_logs
