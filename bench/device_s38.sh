#!/usr/bin/env bash
# Session 38's device stages (written without a device: session 38 was lent none). Usage:
# bash bench/device_s38.sh STAGE...
#   pack      every file under $OUT into one all.tgz (the run returns eight files at most): last
#   other stages go to bench/device_s37.sh (tests, rows, rowse2e, unseen, zoo); its `rows` now
#             also times the split-K sibling tiles (bench/siblings_gemv.py TILES_MMA), its `rowse2e`
#             TUNEDB_SIBLING_SPLIT=auto in the same rounds (`tunedb, split auto`), and its `tests` the
#             split-K form in a graph (tests/gpu/test_gemm_siblings_gpu.py)
# The first call planned: GPU_TESTS=tests/gpu/test_gemm_siblings_gpu.py E2E_ROWS=16 \
#   bash bench/device_s38.sh tests unseen zoo rowse2e rows pack
. "$(dirname "$0")/device_env.sh"
for stage in "$@"; do
  case "$stage" in
    pack) stamp "stage pack"; (cd "$OUT" && tar czf /tmp/all.tgz . && rm -rf "${OUT:?}"/* && mv /tmp/all.tgz "$OUT/") ;;
    *) OUT=$OUT bash bench/device_s37.sh "$stage" ;;
  esac
done
