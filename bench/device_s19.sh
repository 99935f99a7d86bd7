#!/usr/bin/env bash
# Session 19's device calls: this session's stages, each in its own tarball ($OUT/<stage>.tgz);
# any other stage name is handed to bench/device_s18.sh (and on down to device_s14.sh).
# SKIP_AFTER_S skips every later stage once the call has run that long.
#   bash bench/device_s19.sh glsm-l2
# glsm-l2   bench/glsm_l2.py (the row pass forward vs from the last row block, into a separate
#           output vs in place; issue 25; ~90 s)
# nvmath    bench/nvmath_install.sh then bench/nvmath_probe.py (cuSOLVERDx through nvmath-python's
#           device API: potrf/posv against torch; issue 19's optional dependency tier; carry
#           .carry/nvmath, built by bench/nvmath_carry.sh; ~200 s)
# nvmath-tests  the installer, then tests/gpu/test_linalg_nvmath_gpu.py (the tier's arm; ~120 s)
# nvmath-tune   potrf/posv at n = 64, 128 re-tuned with the tier in the ladder (4 Triton arms, the
#               shipped table as the base) to $OUT/db/sm90/linalg.json, then what the whole table
#               serves (bench/linalg_served.py over all six ops); after nvmath-tests (~200-300 s)
. "$(dirname "$0")/device_runner.sh"
for s in "$@"; do
  skipping "$s" && continue
  case $s in
    glsm-l2) run_stage glsm_l2 "${GLSM_L2_S:-170}" "python bench/glsm_l2.py --budget-s ${GLSM_L2_BUDGET:-120} --out \$OUT/glsm_l2.json" ;;
    nvmath) run_stage nvmath "${NVMATH_S:-330}" "bash bench/nvmath_install.sh; PYTHONPATH=src python bench/nvmath_probe.py --budget-s ${NVMATH_BUDGET:-240} --ns ${NVMATH_NS:-8,16,32} --bpbs ${NVMATH_BPBS:-suggested,1} --out \$OUT/nvmath" ;;
    nvmath-tests) run_stage nvmath_tests "${NVMATH_TESTS_S:-240}" "bash bench/nvmath_install.sh && PYTHONPATH=src python -m pytest -m gpu -q -x -p no:cacheprovider tests/gpu/test_linalg_nvmath_gpu.py" ;;
    nvmath-tune) run_stage nvmath_tune "${NVMATH_TUNE_S:-330}" "PYTHONPATH=src python -m tunedb linalg tune --pick low --max-rounds 45 --legs solver --ops potrf,posv --n 64,128 --max-arms 4 --build-jobs 15 --samples \$OUT/nvmath_tune.jsonl --base src/tunedb/db/sm90/linalg.json --out \$OUT/db/sm90/linalg.json && PYTHONPATH=src python bench/linalg_served.py --table \$OUT/db/sm90/linalg.json --ops dot,gemv,gemm,trsv,potrf,posv --max-n 128 --out \$OUT/served_all.json" ;;
    *) bash "$HERE/device_s18.sh" "$s" ;;
  esac
done
echo "[device_s19] done in $(( $(date +%s) - T0 )) s"
