#!/usr/bin/env bash
# Session 56's device stages. Usage: bash bench/device_s56.sh STAGE...
#   tests   GPU test files named in $GPU_TESTS (default: this session's and the families it touched)
#   unit    this session's CPU tests under the device's torch / Triton
#   eager   bench/compile_nograph.py --mode eager: HF Llama-3-8B layers, tunedb.optimize() against
#           plain eagerly beside an A/A copy, shuffled rounds (log eager$EG_TAG.txt; EG_FLAGS=--gc-off)
#   eprof   bench/eager_profile.py --quick: where the eager forward's host time goes, per module
#   bisect  bench/eager_bisect.py: the eager gap with one part of optimize() left out per arm
. "$(dirname "$0")/device_env.sh"
for stage in "$@"; do
  case "$stage" in
    tests) for f in ${GPU_TESTS:-test_inputs_s56_gpu test_linalg_eager_gpu test_scaled_mm_gpu}; do
             stamp "tests $f"
             timeout ${TEST_S:-150} python -m pytest -m gpu -q -p no:cacheprovider "tests/gpu/$f.py" > "$OUT/tests_$f.txt" 2>&1
             echo "$f rc=$? $(tail -1 "$OUT/tests_$f.txt")"
           done ;;
    unit) stamp "unit"
          timeout ${UNIT_S:-150} python -m pytest -q -p no:cacheprovider tests/unit/test_linalg_cutoff_s56.py \
            tests/unit/test_scaled_mm_scales_s56.py tests/unit/test_optimize_attrs_s56.py > "$OUT/unit.txt" 2>&1
          echo "unit rc=$? $(tail -1 "$OUT/unit.txt")" ;;
    eager) stamp "stage eager"
           timeout ${EG_S:-300} python bench/compile_nograph.py --model llama-3-8b --mode eager --batches ${EG_BATCHES:-1,16} \
             --layers ${EG_LAYERS:-8} --private-code --aa --rounds ${EG_ROUNDS:-15} --profile-calls 20 ${EG_FLAGS:-} \
             --out "$OUT/eager${EG_TAG:-}.json" > "$OUT/eager${EG_TAG:-}.txt" 2>&1
           grep "== \|ms compile\|A/A\|gc coll" "$OUT/eager${EG_TAG:-}.txt" | cut -c1-300 ;;
    eprof) stamp "stage eprof"
           timeout ${EP_S:-200} python bench/eager_profile.py --quick --batches ${EP_BATCHES:-1} --no-s17-backoff \
             --out "$OUT/eager_profile.json" > "$OUT/eager_profile.txt" 2>&1
           echo "eprof rc=$?"; tail -60 "$OUT/eager_profile.txt" | cut -c1-200 ;;
    bisect) stamp "stage bisect"
            timeout ${EB_S:-200} python bench/eager_bisect.py --layers ${EB_LAYERS:-8} --batches ${EB_BATCHES:-1,16} \
              --rounds ${EB_ROUNDS:-9} --out "$OUT/eager_bisect.json" > "$OUT/eager_bisect.txt" 2>&1
            echo "bisect rc=$?"; grep -v "^USDT\|Warn\|warn" "$OUT/eager_bisect.txt" | tail -20 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
stamp done
