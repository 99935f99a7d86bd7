#!/usr/bin/env bash
# Session 16's device calls: this session's stages, each in its own tarball ($OUT/<stage>.tgz);
# any other stage name is handed to bench/device_s15.sh (and from there to device_s14.sh, where
# `script:stage` runs that stage of bench/device_<script>.sh). SKIP_AFTER_S skips every later
# stage once the call has run that long.
#   bash bench/device_s16.sh tests gemv-bf16 unseen fp8-block-exh
# gemv-bf16  bench/decode_gemv_bf16.py --quick (issue 18: a bf16 GEMV kernel for the decode lane; ~120 s)
# unseen     bench/unseen_shapes.py --quick (what the tables served at unmeasured shapes before vs now; ~60 s)
. "$(dirname "$0")/device_runner.sh"
for s in "$@"; do
  skipping "$s" && continue
  case $s in
    gemv-bf16) run_stage gemv_bf16 "${GEMV_BF16_S:-150}" "python bench/decode_gemv_bf16.py ${GEMV_BF16_ARGS:---quick} --out \$OUT/decode_gemv_bf16.json" ;;
    unseen) run_stage unseen "${UNSEEN_S:-100}" "python bench/unseen_shapes.py --quick --out \$OUT/unseen" ;;
    *) bash "$HERE/device_s15.sh" "$s" ;;
  esac
done
echo "[device_s16] done in $(( $(date +%s) - T0 )) s"
