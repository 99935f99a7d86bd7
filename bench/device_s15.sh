#!/usr/bin/env bash
# Session 15's device calls: this session's stages, each script's logs in its own tarball
# ($OUT/<stage>.tgz); any other stage name is handed to bench/device_s14.sh (`script:stage` runs
# that stage of bench/device_<script>.sh). SKIP_AFTER_S skips every later stage once the call has
# run that long.
#   bash bench/device_s15.sh tests decode-pf glsm-rows gemv-fp8 repro
# tests       GPU_TESTS="file ..." side by side (kernel tests: compile-bound), KT_S each: device_s12.sh's
#             gpu-tests, its logs in one tarball
# decode-pf   bench/decode_pf.py --quick (issue 18: the decode lane's L2-prefetch twins; ~100 s)
# glsm-rows   bench/glsm_rows.py --quick (issue 25: the row pass's vector hint, PDL, persistent pass; ~70 s)
# gemv-fp8    bench/decode_gemv_fp8.py --quick (issue 20: the fp8/int8 GEMV kernel at M <= 16; ~60 s)
# linalg-goal bench/linalg_ladder.py --goal (issue 19: every packing and torch at the goal cells)
# glsm-build  the gemm_log_softmax table rebuilt (its kernels' hash moved), copied to $OUT/db/:
#             device_s14.sh's glsm-rebuild
# scaled-build  the int8, fp8 block and fp8 row-wise tables rebuilt, copied to $OUT/db/
# repro       bench/device_s13_repro.sh: the linalg table tuned twice in one call, compared (~135 s)
. "$(dirname "$0")/device_runner.sh"
for s in "$@"; do
  skipping "$s" && continue
  case $s in
    tests) LOGS_TGZ=gpu-tests.tgz bash "$HERE/device_s12.sh" gpu-tests ;;  # one tarball: the device returns so many files
    decode-pf) run_stage decode_pf "${DECODE_PF_S:-150}" "python bench/decode_pf.py --quick --out \$OUT/decode_pf.json" ;;
    glsm-rows) run_stage glsm_rows "${GLSM_ROWS_S:-120}" "python bench/glsm_rows.py --quick --out \$OUT/glsm_rows" ;;
    gemv-fp8) run_stage gemv_fp8 "${GEMV_S:-120}" "python bench/decode_gemv_fp8.py ${GEMV_ARGS:---quick} --out \$OUT/decode_gemv_fp8.json" ;;
    linalg-goal) run_stage linalg_goal "${LINALG_GOAL_S:-200}" "python bench/linalg_ladder.py --goal ${LINALG_GOAL_ARGS:-} --out \$OUT/linalg_goal.json" ;;
    glsm-build) bash "$HERE/device_s14.sh" glsm-rebuild ;;  # the same build (its GLSM_S)
    repro) LOGS_TGZ=repro.tgz bash "$HERE/device_s13_repro.sh" ;;
    scaled-build)  # both W8A8 tables rebuilt (the families' hash moved with the GEMV kernel)
      run_stage scaled_int8 "${INT8_S:-150}" "python -m tunedb build --family scaled_mm --out system --no-fill --top-k 8 --fresh --census bench/census/quant_llama_int8.json --run-id s15-int8-\$(date +%s) && cp src/tunedb/db/sm90/scaled_mm.json \$FINAL/db/"
      run_stage scaled_fp8_block "${BLOCK_S:-120}" "python -m tunedb build --family scaled_mm_fp8 --out system --no-fill --top-k 16 --tie-band 0.01 --fresh --census bench/census/quant_llama_fp8-block.json --run-id s15-block-\$(date +%s) && cp src/tunedb/db/sm90/scaled_mm_fp8.json \$FINAL/db/"
      run_stage scaled_fp8_row "${ROW_S:-150}" "python -m tunedb build --family scaled_mm_fp8 --out system --no-fill --top-k 8 --census bench/census/quant_llama_fp8-rowwise.json --run-id s15-row-\$(date +%s) && cp src/tunedb/db/sm90/scaled_mm_fp8.json \$FINAL/db/" ;;
    *) bash "$HERE/device_s14.sh" "$s" ;;
  esac
done
echo "[device_s15] done in $(( $(date +%s) - T0 )) s"
