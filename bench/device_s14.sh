#!/usr/bin/env bash
# Session 14's device calls: chains the earlier sessions' stage scripts in one call, each script's
# logs in its own tarball ($OUT/<script>.tgz), and the stages of this session. A stage named
# `script:stage` runs that stage of bench/device_<script>.sh; SKIP_AFTER_S skips every later
# stage once the call has run that long (the device call's own limit would otherwise kill a stage
# half done, and a killed build writes no table).
#   bash bench/device_s14.sh s13_linalg:goal s13_linalg:retune s13_linalg:tests s13_tune:profile-test glsm-table
# glsm-table (about 3 min): the shipped gemm_log_softmax table (docs/gemm_log_softmax.md).
# decode (about 2.5 min): tests/gpu/test_decode_stream_gpu.py, bench/decode_lane_s14.py.
# glsm-small (about 2 min): tests/gpu/test_gemm_log_softmax_rowfix_gpu.py, bench/glsm_small_m.py --quick.
set -u
T0=$(date +%s)
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/db"
for s in "$@"; do
  if [ -n "${SKIP_AFTER_S:-}" ] && [ $(( $(date +%s) - T0 )) -gt "$SKIP_AFTER_S" ]; then
    echo "[skip $s] $(( $(date +%s) - T0 )) s > SKIP_AFTER_S=$SKIP_AFTER_S"; continue
  fi
  case $s in
    *:*) script=${s%%:*}; st=${s#*:}
      LOGS_TGZ=$script-$st.tgz bash "$(dirname "$0")/device_$script.sh" $st ;;
    glsm-table)
      LOGS_TGZ=glsm-table.tgz bash -c '. "$(dirname "$0")/device_stages.sh"; record_env
        stage glsm_build ${GLSM_S:-240} "python -m tunedb build --family gemm_log_softmax --census bench/census/ctc_heads.json --no-fill --out system --fresh --run-id s14-glsm && cp src/tunedb/db/sm90/gemm_log_softmax.json $FINAL/db/"
        stage glsm_tests ${GLSM_TESTS_S:-90} "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_gemm_log_softmax_gpu.py"
        pack_logs' "$0" ;;
    decode)  # issue 18: the decode lane's stream kernel (docs/decode_stream.md): GPU tests, then the bench
      LOGS_TGZ=decode.tgz bash -c '. "$(dirname "$0")/device_stages.sh"; record_env
        stage decode_tests ${DECODE_TESTS_S:-90} "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_decode_stream_gpu.py"
        stage decode_bench ${DECODE_S:-150} "python bench/decode_lane_s14.py --budget-s ${DECODE_BUDGET:-70} --out $OUT/decode_lane_s14.json"
        pack_logs' "$0" ;;
    glsm-small)  # issue 25: the triton_rowfix lane: GPU tests, then bench/glsm_small_m.py
      LOGS_TGZ=glsm-small.tgz bash -c '. "$(dirname "$0")/device_stages.sh"; record_env
        stage rowfix_tests ${ROWFIX_TESTS_S:-90} "python -m pytest -m gpu -q -rf --tb=short tests/gpu/test_gemm_log_softmax_rowfix_gpu.py"
        stage glsm_small ${GLSM_SMALL_S:-130} "python bench/glsm_small_m.py ${GLSM_SMALL_ARGS:---quick} --out $OUT/glsm_small"
        pack_logs' "$0" ;;
    fp8-block-exh)  # issue 20: every block-valid config at every census point through the build's own
      # protocol (one measurement); its log comes back for bench/fp8_block_seeds.py on the CPU
      ( LOGS_TGZ=fp8-block-exh.tgz; . "$(dirname "$0")/device_stages.sh"; record_env
        export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$HOME/.cache/tunedb/triton}
        stage fp8_block_compile 60 "python -c \"import sys; sys.path.insert(0, 'bench'); import fp8_block_exhaustive as b; print(round(b.compile_all(b.block_space(), 8), 1), 's')\""
        stage fp8_block_exh ${FP8_EXH_S:-200} "python -m tunedb build --family scaled_mm_fp8 --census bench/census/quant_llama_fp8-block.json --no-fill --exhaustive --out $OUT/exh --run-id s14-fp8-exh-$(date +%s) && gzip -c $OUT/exh/measurements.jsonl > $OUT/fp8_block_exh_measurements.jsonl.gz && rm -f $OUT/exh/measurements.jsonl"
        pack_logs ) ;;
    glsm-rebuild)  # the gemm_log_softmax table after the rowfix lane (the family hash moved)
      LOGS_TGZ=glsm-rebuild.tgz bash -c '. "$(dirname "$0")/device_stages.sh"; record_env
        stage glsm_build ${GLSM_S:-200} "python -m tunedb build --family gemm_log_softmax --census bench/census/ctc_heads.json --no-fill --out system --fresh --run-id s14-glsm2-$(date +%s) && cp src/tunedb/db/sm90/gemm_log_softmax.json $FINAL/db/"
        pack_logs' "$0" ;;
    *) echo "unknown stage $s" ;;
  esac
done
echo "[device_s14] done in $(( $(date +%s) - T0 )) s"
