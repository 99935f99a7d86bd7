#!/usr/bin/env bash
# Session 34's device stages (see BENCHMARKS.md "Session 34"): each stage under its own timeout,
# logs under $OUT. Usage: bash bench/device_s34.sh STAGE...
#   gvtests  the gv GPU tests (family path with the PDL twins and their guard, the bench kernels)
#   build    the gemm system tier rebuilt from the preset censuses (bench/device_session.sh buildall
#            evaluate), the table copied to $OUT/gemm_sm90.json
#   e2e      Llama-3-8B decode end to end on the tree's (rebuilt) gemm tier, b1 and b16
#   chain    bench/gv_prefetch.py (back to back and the Llama layer chain)
#   chaine2e bench/chain_pdl_e2e.py (Llama-3-8B decode in graphs, PDL twins after ours on / off)
#   zoo      the unseen-zoo GPU tests and bench (every model of bench/unseen_zoo_models.py)
. "$(dirname "$0")/device_env.sh"
for stage in "$@"; do
  stamp "stage $stage"
  case "$stage" in
    gvtests) timeout ${GVT_S:-200} python -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gemm_gv_family_gpu.py \
               tests/gpu/test_gemm_gemv_gpu.py 2>&1 | tee "$OUT/gv_tests.log" | tail -15 ;;
    build) OUT=$OUT/build BUILD_S=${BUILD_S:-330} bash bench/device_session.sh buildall evaluate > "$OUT/build.log" 2>&1
           tail -30 "$OUT/build.log"; cp src/tunedb/db/sm90/gemm.json "$OUT/gemm_sm90.json" ;;
    e2e) timeout ${E2E_S:-260} python bench/e2e.py --models llama-3-8b --batches 1,16 --budget-s ${E2E_BUDGET:-240} \
           --out "$OUT/e2e_llama.json" 2>&1 | tee "$OUT/e2e_llama.log" | tail -40 ;;
    chain) timeout ${CHAIN_S:-150} python bench/gv_prefetch.py --out "$OUT/gv_prefetch.json" > "$OUT/gv_prefetch.log" 2>&1
           grep -v "^[0-9]*x[0-9]* M=" "$OUT/gv_prefetch.log" | tail -40 ;;
    chaine2e) timeout ${CE_S:-200} python bench/chain_pdl_e2e.py --out "$OUT/chain_pdl_e2e.json" 2>&1 \
           | tee "$OUT/chain_pdl_e2e.log" | tail -12 ;;
    zoo) timeout ${ZOOT_S:-240} python -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_unseen_zoo_gpu.py 2>&1 \
           | tee "$OUT/zoo_tests.log" | tail -15
         timeout ${ZOO_S:-300} python bench/unseen_zoo.py --out "$OUT/zoo.json" 2>&1 | tee "$OUT/zoo.log" | tail -40 ;;
    *) echo "unknown stage $stage" ;;
  esac
done
stamp done
