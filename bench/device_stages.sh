# The device scripts' shared part (sourced by bench/device_*.sh, from the repository root):
# the environment, where logs go, and `stage NAME TIMEOUT_S COMMAND`, which runs COMMAND under its
# own timeout into LOGS/NAME.log, prints its exit status, time and last lines, and packs LOGS into
# $FINAL/logs.tgz after every stage. Logs live outside $OUT and tables go to $FINAL/db/, so what
# comes back from a call is one tarball plus the tables even when the call's limit kills it (the
# device tool returns only so many files: session 13 call F lost two of its three folders).
# LOGS_TGZ names the tarball, so that several scripts chained in one call keep each one's logs.
set -u
FINAL=${OUT:-/tmp/out}
LOGS=$(mktemp -d /tmp/tunedb-device-logs.XXXXXX)/logs
mkdir -p "$LOGS" "$FINAL/db"
OUT=$LOGS  # the stages write their JSON and logs here; packed after each stage
export PYTHONPATH=${DEVICE_PYTHONPATH:-src} TUNEDB_USER_DB=off
STAGE_TAIL=${STAGE_TAIL:-8}

stage() {  # name timeout_s command...
  local name=$1 t=$2; shift 2
  local t0=$(date +%s)
  echo "[stage $name] start $(date -u +%T)"
  timeout "$t" bash -c "$*" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "[stage $name] rc=$rc in $(( $(date +%s) - t0 )) s"
  tail -n "$STAGE_TAIL" "$LOGS/$name.log"
  pack_logs
}

pack_logs() {
  tar -czf "$FINAL/.logs.tmp" -C "$(dirname "$LOGS")" logs 2>/dev/null && mv -f "$FINAL/.logs.tmp" "$FINAL/${LOGS_TGZ:-logs.tgz}"
}

record_env() {  # the GPU's clocks and the versions, into LOGS/smi.txt
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv > "$LOGS/smi.txt" 2>&1
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$LOGS/smi.txt" 2>&1
  lscpu > "$LOGS/lscpu.txt" 2>&1
}
