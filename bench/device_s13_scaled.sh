#!/usr/bin/env bash
# Session 13's scaled_mm device call (issue 20): stages by name, each under its own timeout, logs
# and rebuilt tables under $OUT.
#   bash bench/device_s13_scaled.sh [STAGE...]   (run on the device from the repository root;
#   no STAGE: all of them, in this order, about 200 s expected, 300 s at most by the timeouts)
# fp8-build-block  the block-scaled census rebuilt at --top-k 16, merged into the shipped fp8 table
#                  (session 13 A2's top-k 8 missed b64x128x128_w4_s4 at 14336x4096 M=2048, rank 9
#                  of the pruning model) (~55 s)
# scaled-quick     bench/scaled_mm.py --quick, fp8 modes, timed as the protocol times (~60 s)
# pdl-context      bench/pdl_context.py: a _pdl config back to back / after the separator / after
#                  the activation quantizer (~20 s)
# decode-limit-fp8 bench/decode_limit_fp8.py --quick: the read roofline of the fp8 weights' bytes
#                  beside the M <= 16 lane (~25 s)
# fp8-build-row    the row-wise census rebuilt under heuristic rule 2 (the vendor op), --top-k 8,
#                  merged (~35 s; last: until it runs, the row entries keep rule 1's impl_hash and
#                  read stale, serving what they served except the catch-all, now the vendor op)
# Each build stage copies the table to $OUT/db/ (the lead copies it to src/tunedb/db/sm90/).
. "$(dirname "$0")/device_stages.sh"
record_env
CENSUS=bench/census
STAGES=${*:-fp8-build-block scaled-quick pdl-context decode-limit-fp8 fp8-build-row}
for s in $STAGES; do
  case $s in
    fp8-build-block)
      stage fp8_build_block 90 "python -m tunedb build --family scaled_mm_fp8 --out system --no-fill --top-k ${BLOCK_K:-16} --census $CENSUS/quant_llama_fp8-block.json"
      cp src/tunedb/db/sm90/scaled_mm_fp8.json "$FINAL/db/" ;;
    scaled-quick)
      stage scaled_quick 75 "python bench/scaled_mm.py --quick --modes fp8_row,fp8_block --budget-s 30 --out $OUT/scaled_mm_quick.json" ;;
    pdl-context)
      stage pdl_context 35 "python bench/pdl_context.py --out $OUT/pdl_context.json" ;;
    decode-limit-fp8)
      stage decode_limit_fp8 40 "python bench/decode_limit_fp8.py --quick --out $OUT/decode_limit_fp8.json" ;;
    fp8-build-row)
      stage fp8_build_row 120 "python -m tunedb build --family scaled_mm_fp8 --out system --no-fill --top-k 8 --census $CENSUS/quant_llama_fp8-rowwise.json"
      cp src/tunedb/db/sm90/scaled_mm_fp8.json "$FINAL/db/" ;;
    gpu-tests)  # optional, ~15 s: the untuned fp8 choice on the GPU
      stage gpu_tests 60 "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_scaled_mm_heuristic_gpu.py" ;;
    *) echo "unknown stage $s" ;;
  esac
done
pack_logs
