#!/usr/bin/env bash
# Session 30's device calls: this session's stages, each in its own tarball ($OUT/<stage>.tgz);
# any other stage name is handed to bench/device_s29.sh (and on down).
#   bash bench/device_s30.sh sweep linalg-unseen
# sweep          bench/unseen_sweep.py: random shapes, served arm vs the vendor op (SWEEP_SEEDS, SWEEP_ARGS)
# linalg-unseen  bench/linalg_eager.py --unseen: linalg cells off the table's grid, tunedb vs torch (LU_ARGS)
# unseen-model   bench/unseen_model.py: a decoder no table names, optimize() vs plain, eager and graphs; then unseen_model_profile.py
# gemv-armed     bench/linalg_eager.py --ops gemv with TUNEDB_EAGER_FALLBACK=0: the tuned gemv arms' own eager launches
. "$(dirname "$0")/device_runner.sh"
for s in "$@"; do
  skipping "$s" && continue
  case $s in
    sweep) run_stage sweep "${SWEEP_S:-330}" "for seed in ${SWEEP_SEEDS:-0}; do PYTHONPATH=src python bench/unseen_sweep.py --seed \$seed --out \$OUT/seed\$seed ${SWEEP_ARGS:-}; done" ;;
    unseen-model) run_stage unseen_model "${UM_S:-200}" "PYTHONPATH=src python bench/unseen_model.py --out \$OUT/unseen_model.json && cd bench && PYTHONPATH=../src python unseen_model_profile.py" ;;
    linalg-unseen) run_stage linalg_unseen "${LU_S:-240}" "PYTHONPATH=src python bench/linalg_eager.py --unseen --reps 40 --rounds 5 ${LU_ARGS:-} --out \$OUT/linalg_unseen.json" ;;
    gemv-armed) run_stage gemv_armed "${GA_S:-120}" "TUNEDB_EAGER_FALLBACK=0 PYTHONPATH=src python bench/linalg_eager.py --ops gemv --out \$OUT/gemv_armed.json" ;;
    *) bash "$HERE/device_s29.sh" "$s" ;;
  esac
done
echo "[device_s30] done in $(( $(date +%s) - T0 )) s"
