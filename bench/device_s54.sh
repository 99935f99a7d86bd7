#!/usr/bin/env bash
# Session 54's device stages. Usage: bash bench/device_s54.sh STAGE...
#   guards    bench/guard_cost.py on CUDA with Inductor (8 layers, --diff): the guard check of the
#             compiled forward's first frame for plain, tuned and a plain copy, and the guards only
#             the tuned model has (log guards.txt)
#   hostprof  bench/compile_nograph.py with --aa --private-code and a 50-forward CPU profile per arm
#             (Dynamo's cache lookups averaged per forward; log hostprof.txt)
. "$(dirname "$0")/device_env.sh"
for stage in "$@"; do
  case "$stage" in
    guards) stamp "stage guards"
            timeout ${GC_S:-240} python bench/guard_cost.py --layers ${GC_LAYERS:-8} --device cuda --backend inductor --diff \
              > "$OUT/guards.txt" 2>&1
            grep -v "^[+-]" "$OUT/guards.txt" | tail -6; grep -c "^[+-]" "$OUT/guards.txt" ;;
    hostprof) stamp "stage hostprof"
              timeout ${NG_S:-300} python bench/compile_nograph.py --model llama-3-8b --batches ${NG_BATCHES:-1,16} \
                --layers ${NG_LAYERS:-8} --private-code --aa --rounds ${NG_ROUNDS:-15} --profile-calls 50 \
                --out "$OUT/hostprof.json" > "$OUT/hostprof.txt" 2>&1
              grep "== \|ms compile\|A/A\|Cache Lookup\|frame " "$OUT/hostprof.txt" | cut -c1-400 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
stamp done
