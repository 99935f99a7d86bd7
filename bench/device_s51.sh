#!/usr/bin/env bash
# Session 51's device stages. Usage: bash bench/device_s51.sh STAGE...
#   nograph / graphs  bench/device_s47.sh's (NG_LAYERS=8 --private-code: the no-graph compile after
#                     the fused pair's int-key trace constant)
#   tests FILE...     pytest -m gpu over each test file in turn (TEST_S seconds each; logs tests_<file>.txt)
#   unit FILE...      the CPU tests FILE (tests/unit/FILE.py) under the device's torch (session 53:
#                     the trace-time caller check reads Dynamo's translators; log unit.txt)
. "$(dirname "$0")/device_env.sh"
stage=$1; shift
case "$stage" in
  nograph|graphs) NG_LAYERS=${NG_LAYERS:-8} NG_ORDER=${NG_ORDER:---private-code} OUT=$OUT bash bench/device_s47.sh "$stage" ;;
  tests) for f in "$@"; do
           stamp "tests $f"
           timeout ${TEST_S:-120} python -m pytest -m gpu -q -p no:cacheprovider "tests/gpu/$f.py" > "$OUT/tests_$f.txt" 2>&1
           echo "$f rc=$? $(tail -1 "$OUT/tests_$f.txt")"
         done ;;
  unit) stamp "unit $*"
        timeout ${TEST_S:-120} python -m pytest -q -p no:cacheprovider $(printf 'tests/unit/%s.py ' "$@") > "$OUT/unit.txt" 2>&1
        echo "unit rc=$? $(tail -1 "$OUT/unit.txt")" ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
stamp "done $stage"
