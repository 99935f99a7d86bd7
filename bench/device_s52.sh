#!/usr/bin/env bash
# Session 52's device stages. Usage: bash bench/device_s52.sh STAGE...
#   tests FILE...   pytest -m gpu over each test file in turn (TEST_S seconds each; logs tests_<file>.txt)
#   nograph / graphs  bench/device_s47.sh's (NG_LAYERS=8 --private-code), as session 51's
. "$(dirname "$0")/device_env.sh"
stage=$1; shift
case "$stage" in
  nograph|graphs) NG_LAYERS=${NG_LAYERS:-8} NG_ORDER=${NG_ORDER:---private-code} OUT=$OUT bash bench/device_s47.sh "$stage" ;;
  tests) for f in "$@"; do
           stamp "tests $f"
           timeout ${TEST_S:-120} python -m pytest -m gpu -q -p no:cacheprovider "tests/gpu/$f.py" > "$OUT/tests_$f.txt" 2>&1
           echo "$f rc=$? $(tail -1 "$OUT/tests_$f.txt")"
         done ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
stamp "done $stage"
