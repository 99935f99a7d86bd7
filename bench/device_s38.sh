#!/usr/bin/env bash
# Session 38's device stages (written without a device: session 38 was lent none). Usage:
# bash bench/device_s38.sh STAGE...
#   probe3b   bench/sibling_fusion_probe.py --model llama-3.2-3b (keys no shipped table names: its
#             siblings are left-as-written members; split auto in the same rounds)
#   fp8xm     bench/decode_gemv_fp8.py --quick --xm: the fp8 row-wise GEMV with x on the MMA's M side
#             (bench/fp8_gemv_xm.py, a probe) beside the family's gv configs, _scaled_mm and a read
#   build5    the gemm system tier rebuilt over five presets' censuses (the four shipped ones and
#             llama-3.2-3b decode) in one build, and its evaluate: a measurement log for
#             bench/lomo_regret.py with a fifth model (decode weights of 6-50 MB), and a table to ship
#             if its regret holds (bench/device_session.sh buildall; logs in $OUT/session.tgz)
#   pack      every file under $OUT into one all.tgz (the run returns eight files at most): last
#   other stages go to bench/device_s37.sh (tests, rows, rowse2e, unseen, zoo); its `rows` now
#             also times the split-K sibling tiles (bench/siblings_gemv.py TILES_MMA), its `rowse2e`
#             TUNEDB_SIBLING_SPLIT=auto in the same rounds (`tunedb, split auto`), and its `tests` the
#             split-K form in a graph (tests/gpu/test_gemm_siblings_gpu.py)
# The calls planned (each under 600 s): 1. GPU_TESTS=tests/gpu/test_gemm_siblings_gpu.py E2E_ROWS=16 \
#   bash bench/device_s38.sh tests unseen zoo rowse2e pack; 2. bash bench/device_s38.sh rows probe3b fp8xm pack;
#   3. bash bench/device_s38.sh build5 (then, on the CPU: bench/lomo_regret.py --log its measurements)
. "$(dirname "$0")/device_env.sh"
for stage in "$@"; do
  case "$stage" in
    probe3b) stamp "stage probe3b"; timeout ${PROBE_S:-150} python bench/sibling_fusion_probe.py --model llama-3.2-3b \
               --out "$OUT/sibling_probe_3b.json" 2>&1 | tee "$OUT/sibling_probe_3b.log" | tail -9 ;;
    fp8xm) stamp "stage fp8xm"; timeout ${FP8_S:-200} python bench/decode_gemv_fp8.py --quick --xm \
             --out "$OUT/decode_gemv_fp8_xm.json" 2>&1 | tee "$OUT/decode_gemv_fp8_xm.log" | tail -30 ;;
    build5) stamp "stage build5"
            CENSUS="whisper-base_offline whisper-large-v3_offline conformer_streaming llama-3-8b_decode llama-3.2-3b_decode" \
              BUILD_S=${BUILD_S:-420} OUT=$OUT bash bench/device_session.sh buildall evaluate | tail -30 ;;
    pack) stamp "stage pack"; (cd "$OUT" && tar czf /tmp/all.tgz . && rm -rf "${OUT:?}"/* && mv /tmp/all.tgz "$OUT/") ;;
    *) OUT=$OUT bash bench/device_s37.sh "$stage" ;;
  esac
done
