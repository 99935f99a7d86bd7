#!/usr/bin/env bash
# Session 25's device calls: this session's stages, each in its own tarball ($OUT/<stage>.tgz);
# any other stage name is handed to bench/device_s24.sh (and on down).
#   bash bench/device_s25.sh agree-all
# agree-all  bench/linalg_agree_all.sh: the whole linalg grid tuned twice in one call (seeds 0, 1)
#            and the picks compared (issue 19's agreement goal); AGREE_S bounds it (default 560 s)
. "$(dirname "$0")/device_runner.sh"
for s in "$@"; do
  skipping "$s" && continue
  case $s in
    agree-all) run_stage agree_all "${AGREE_S:-560}" "bash bench/linalg_agree_all.sh" ;;
    *) bash "$HERE/device_s24.sh" "$s" ;;
  esac
done
echo "[device_s25] done in $(( $(date +%s) - T0 )) s"
