#!/usr/bin/env bash
# Session 24's device calls: this session's stages, each in its own tarball ($OUT/<stage>.tgz);
# any other stage name is handed to bench/device_s23.sh (and on down).
#   bash bench/device_s24.sh tile-tests blocked-variants
# blocked-variants  bench/blocked_variants.py: the blocked kernel's compile-time variants (lookahead, register cap) side by side
. "$(dirname "$0")/device_runner.sh"
for s in "$@"; do
  skipping "$s" && continue
  case $s in
    blocked-variants) run_stage blocked_variants "${VARIANTS_S:-200}" "PYTHONPATH=src python bench/blocked_variants.py ${VARIANTS_ARGS:-} --out \$OUT/blocked_variants.json" ;;
    *) bash "$HERE/device_s23.sh" "$s" ;;
  esac
done
echo "[device_s24] done in $(( $(date +%s) - T0 )) s"
