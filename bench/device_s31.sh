#!/usr/bin/env bash
# Session 31's device calls: this session's stages, each in its own tarball ($OUT/<stage>.tgz);
# any other stage name is handed to bench/device_s30.sh (and on down).
#   bash bench/device_s31.sh zoo
# zoo   bench/unseen_zoo.py: eight models no table names, optimize() vs plain: errors against fp32, eager and graphs (ZOO_ARGS)
. "$(dirname "$0")/device_runner.sh"
for s in "$@"; do
  skipping "$s" && continue
  case $s in
    zoo) run_stage zoo "${ZOO_S:-240}" "cd bench && PYTHONPATH=../src python unseen_zoo.py --out \$OUT/zoo.json ${ZOO_ARGS:-}" ;;
    *) bash "$HERE/device_s30.sh" "$s" ;;
  esac
done
echo "[device_s31] done in $(( $(date +%s) - T0 )) s"
