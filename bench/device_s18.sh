#!/usr/bin/env bash
# Session 18's device calls: this session's stages, each in its own tarball ($OUT/<stage>.tgz);
# any other stage name is handed to bench/device_s17.sh (and on down to device_s14.sh).
# SKIP_AFTER_S skips every later stage once the call has run that long.
#   bash bench/device_s18.sh eager-prof glsm-chunks gemv-bf16
# eager-prof     bench/eager_profile.py --quick (Llama-3-8B-shaped decode, eager: plain vs tunedb,
#                host profile; issue 18; ~90 s)
# glsm-chunks    bench/glsm_chunks.py --quick (the row pass on M chunks while their logits sit in
#                L2; issue 25; ~90 s)
# linalg-blocked bench/linalg_blocked.py --quick (the shfl packing's potrf/posv vs torch and the
#                shipped pick; issue 19; ~90 s)
# interference   bench/launch_interference.py (does a Triton launch slow the host's next torch
#                call? issue 18, eager; ~20 s)
. "$(dirname "$0")/device_runner.sh"
for s in "$@"; do
  skipping "$s" && continue
  case $s in
    eager-prof) run_stage eager_prof "${EAGER_PROF_S:-150}" "python bench/eager_profile.py --quick --out \$OUT/eager_profile.json" ;;
    glsm-chunks) run_stage glsm_chunks "${GLSM_CHUNKS_S:-150}" "python bench/glsm_chunks.py --quick --out \$OUT/glsm_chunks.json" ;;
    linalg-blocked) run_stage linalg_blocked "${LINALG_BLOCKED_S:-150}" "python bench/linalg_blocked.py --quick --out \$OUT/linalg_blocked.json" ;;
    interference) run_stage interference "${INTERFERENCE_S:-90}" "python bench/launch_interference.py --out \$OUT/launch_interference.json" ;;
    *) bash "$HERE/device_s17.sh" "$s" ;;
  esac
done
echo "[device_s18] done in $(( $(date +%s) - T0 )) s"
