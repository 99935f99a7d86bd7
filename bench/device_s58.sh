#!/usr/bin/env bash
# Session 58's device call: the fused-pair eager change (gemm/model.py eager_fallback, the eager
# memo before fused_here) measured where session 57 found the gap. Usage: bash bench/device_s58.sh
#   tests   the GPU tests of the change (fused pair eager / capture, host_bound)
#   bisect  bench/eager_bisect.py, HF Llama-3-8B layers (EB_LAYERS, EB_ROUNDS)
#   eager   bench/compile_nograph.py --mode eager beside an A/A copy (device_s56.sh's stage)
#   mods    bench/eager_modules.py at batch 1: each module of one layer alone, plain vs optimized
. "$(dirname "$0")/device_env.sh"
for stage in "$@"; do
  case "$stage" in
    tests) stamp tests
           timeout ${TEST_S:-120} python -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_fused_eager_s58_gpu.py \
             tests/gpu/test_host_bound_gpu.py > "$OUT/tests.txt" 2>&1
           echo "tests rc=$? $(tail -1 "$OUT/tests.txt")"; grep -E "^(FAILED|ERROR)|Error" "$OUT/tests.txt" | head -10 | cut -c1-300 ;;
    bisect|eager) bash "$(dirname "$0")/device_s56.sh" "$stage" ;;
    mods) stamp mods
          timeout ${MODS_S:-100} python bench/eager_modules.py --layers 2 --batch ${MODS_B:-1} --cprofile ${MODS_PROF:-50} \
            --out "$OUT/mods.json" > "$OUT/mods.txt" 2>&1
          echo "mods rc=$?"; grep -v "^USDT\|Warn\|warn" "$OUT/mods.txt" | head -24 | cut -c1-200 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
stamp done
