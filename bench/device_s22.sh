#!/usr/bin/env bash
# Session 22's device calls: this session's stages, each in its own tarball ($OUT/<stage>.tgz);
# any other stage name is handed to bench/device_s21.sh (and on down).
# SKIP_AFTER_S skips every later stage once the call has run that long.
#   bash bench/device_s22.sh tile-tests tile-probe
# tile-tests  tests/gpu/test_linalg_cuda_gpu.py -k TILE_TESTS_K (default: the cells at n >= 16 past
#             the warp kernels, non-SPD, in place, both L layouts): the tile kernel cudat_t<TS>
# tile-probe  bench/cuda_probe.py --quick over TILE_OPS (default potrf,posv,trsv) at TILE_NS
#             (default 64,128): every CUDA arm against the shipped pick and torch
# tile-anatomy bench/tile_anatomy.py: the tile kernel timed whole, without its stores, without
#             its factorization, and its loads alone (where its time goes)
# tile-tune   the shipped table re-tuned at TILE_TUNE_OPS (default potrf,posv,trsv) x TILE_TUNE_NS
#             (default 64,128) with the tile kernel in the ladder (TILE_TUNE_ARMS Triton arms,
#             default 6), then bench/linalg_served.py over all six ops
. "$(dirname "$0")/device_runner.sh"
TUNE="PYTHONPATH=src python -m tunedb linalg tune --pick low --max-rounds 45 --legs solver --build-jobs 15"
for s in "$@"; do
  skipping "$s" && continue
  case $s in
    tile-tests) run_stage tile_tests "${TILE_TESTS_S:-240}" "PYTHONPATH=src python -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_linalg_cuda_gpu.py -k \"${TILE_TESTS_K:-n16 or n24 or n33 or n64 or n80 or n100 or n128 or non_spd or in_place or layout}\"" ;;
    tile-probe) run_stage tile_probe "${TILE_PROBE_S:-300}" "PYTHONPATH=src python bench/cuda_probe.py --quick --ops ${TILE_OPS:-potrf,posv,trsv} --ns ${TILE_NS:-64,128} --out \$OUT/tile_probe.json" ;;
    tile-anatomy) run_stage tile_anatomy "${TILE_ANATOMY_S:-150}" "PYTHONPATH=src python bench/tile_anatomy.py --out \$OUT/tile_anatomy.json" ;;
    tile-tune)
      run_stage tile_tune "${TILE_TUNE_S:-420}" "$TUNE --ops ${TILE_TUNE_OPS:-potrf,posv,trsv} --n ${TILE_TUNE_NS:-64,128} --max-arms ${TILE_TUNE_ARMS:-6} --samples \$OUT/tile.jsonl --base src/tunedb/db/sm90/linalg.json --out \$OUT/db/sm90/linalg.json && PYTHONPATH=src python bench/linalg_served.py --table \$OUT/db/sm90/linalg.json --ops dot,gemv,gemm,trsv,potrf,posv --max-n 128 --out \$OUT/served_all.json" ;;
    *) bash "$HERE/device_s21.sh" "$s" ;;
  esac
done
echo "[device_s22] done in $(( $(date +%s) - T0 )) s"
