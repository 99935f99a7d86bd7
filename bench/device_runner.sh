# The per-session device scripts' runner (sourced by bench/device_s15.sh and later): OUT, HERE,
# `run_stage TARBALL TIMEOUT_S COMMAND` (device_stages.sh's `stage` in a subshell whose logs go to
# $OUT/TARBALL.tgz) and `skipping STAGE`, true (and saying so) once the call has run longer than
# SKIP_AFTER_S.
set -u
T0=$(date +%s)
export OUT=${OUT:-/tmp/out}
HERE=$(dirname "$0")
mkdir -p "$OUT/db"
run_stage() {  # tarball-name timeout command
  LOGS_TGZ=$1.tgz bash -c '. "$0/device_stages.sh"; export FINAL OUT; record_env; stage "$1" "$2" "$3"' "$HERE" "$@"
}
skipping() {  # stage
  if [ -n "${SKIP_AFTER_S:-}" ] && [ $(( $(date +%s) - T0 )) -gt "$SKIP_AFTER_S" ]; then
    echo "[skip $1] $(( $(date +%s) - T0 )) s > SKIP_AFTER_S=$SKIP_AFTER_S"; return 0
  fi
  return 1
}
