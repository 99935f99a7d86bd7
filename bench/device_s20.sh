#!/usr/bin/env bash
# Session 20's device calls: this session's stages, each in its own tarball ($OUT/<stage>.tgz);
# any other stage name is handed to bench/device_s19.sh (and on down to device_s14.sh).
# SKIP_AFTER_S skips every later stage once the call has run that long.
#   bash bench/device_s20.sh panel-tests panel-bench
# panel-tests  tests/gpu/test_linalg_panel_gpu.py (issue 19's panel packing: every config inside a
#              captured graph against fp64, non-SPD, in place, replay; ~150 s)
# panel-bench  bench/linalg_blocked.py --quick --packings panel over potrf/posv/trsv at PANEL_NS
#              (default 16,32,64,128) x every batch: torch, the shipped pick, every panel config
# panel-tune   bench/nvmath_install.sh when .carry/nvmath travelled (the tier stays in the ladder),
#              then potrf/posv/trsv at PANEL_TUNE_NS (default 64,128) re-tuned over the shipped table
#              to $OUT/db/sm90/linalg.json (PANEL_ARMS Triton arms, default 6), then what the whole
#              table serves (bench/linalg_served.py over all six ops)
# pdot         bench/pdot_probe.py --quick (kernels_pdot: the panel's update on tl.dot, against the
#              panel packing and torch at potrf/posv n = 64, 128; ~150 s)
# shfl-tests   tests/gpu/test_linalg_shfl_gpu.py (potrf/posv, and trsv since session 20; ~90 s)
# The bench and tune stages take BENCH_PACKINGS / PANEL_OPS / PANEL_NS and PANEL_TUNE_OPS /
# PANEL_TUNE_NS / PANEL_ARMS: `BENCH_PACKINGS=shfl PANEL_OPS=trsv PANEL_NS=4,8,16,32` times trsv's
# shfl configs the same way.
. "$(dirname "$0")/device_runner.sh"
for s in "$@"; do
  skipping "$s" && continue
  case $s in
    panel-tests) run_stage panel_tests "${PANEL_TESTS_S:-260}" "PYTHONPATH=src python -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_linalg_panel_gpu.py" ;;
    panel-bench) run_stage panel_bench "${PANEL_BENCH_S:-300}" "PYTHONPATH=src python bench/linalg_blocked.py --quick --packings ${BENCH_PACKINGS:-panel} --ops ${PANEL_OPS:-potrf,posv,trsv} --n ${PANEL_NS:-16,32,64,128} --out \$OUT/panel_bench.json" ;;
    panel-tune) run_stage panel_tune "${PANEL_TUNE_S:-480}" "if [ -d .carry/nvmath ]; then bash bench/nvmath_install.sh; fi; PYTHONPATH=src python -m tunedb linalg tune --pick low --max-rounds 45 --legs solver --ops ${PANEL_TUNE_OPS:-potrf,posv,trsv} --n ${PANEL_TUNE_NS:-64,128} --max-arms ${PANEL_ARMS:-6} --build-jobs 15 --samples \$OUT/panel_tune.jsonl --base src/tunedb/db/sm90/linalg.json --out \$OUT/db/sm90/linalg.json && PYTHONPATH=src python bench/linalg_served.py --table \$OUT/db/sm90/linalg.json --ops dot,gemv,gemm,trsv,potrf,posv --max-n 128 --out \$OUT/served_all.json" ;;
    pdot) run_stage pdot "${PDOT_S:-260}" "PYTHONPATH=src python bench/pdot_probe.py --quick --out \$OUT/pdot.json" ;;
    shfl-tests) run_stage shfl_tests "${SHFL_TESTS_S:-200}" "PYTHONPATH=src python -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_linalg_shfl_gpu.py" ;;
    *) bash "$HERE/device_s19.sh" "$s" ;;
  esac
done
echo "[device_s20] done in $(( $(date +%s) - T0 )) s"
