#!/usr/bin/env bash
# Session 21's device calls: this session's stages, each in its own tarball ($OUT/<stage>.tgz);
# any other stage name is handed to bench/device_s20.sh (and on down).
# SKIP_AFTER_S skips every later stage once the call has run that long.
#   bash bench/device_s21.sh cuda-tests cuda-probe
# cuda-tests  tests/gpu/test_linalg_cuda_gpu.py (issue 19's CUDA C++ tier: every config inside a
#             captured graph against fp64, non-SPD, in place; ~60 s)
# cuda-probe  bench/cuda_probe.py --quick: the CUDA tier against the shipped pick and torch at
#             potrf/posv n = 4..32 x batch 256/4096/65536 (CUDA_NS, default 4,8,16,32)
# cuda-agree  two tunes of potrf/posv n <= 32 (seeds 0 and 1, separate processes, the shipped
#             settings: --pick low --max-rounds 45 --max-arms 14, the CUDA tier in the ladder), then
#             bench/linalg_pick_replay.py cross on their samples and `tunedb diff` of the two tables
# cuda-tune   (the nvmath carry installed when it travelled, so the dependency tier stays in the
#             ladder) the shipped table re-tuned where the CUDA tier grew (trsv at n <= 32, 14 Triton arms;
#             then potrf at n = 64 and posv at n = 64 in CUDA_POSV64_DTYPES (default fp64: posv fp32
#             n = 64 keeps session 20's entry, where cuSOLVERDx won batch 65536 and the nvmath carry
#             no longer fits beside the tree), CUDA_TUNE_ARMS Triton arms, default 6) to
#             $OUT/db/sm90/linalg.json, then bench/linalg_served.py over all six ops
# trsv-tune   trsv at n <= 32 re-tuned over the shipped table (14 Triton arms + the CUDA tier), then
#             bench/linalg_served.py over all six ops
. "$(dirname "$0")/device_runner.sh"
TUNE="PYTHONPATH=src python -m tunedb linalg tune --pick low --max-rounds 45 --legs solver --build-jobs 15"
for s in "$@"; do
  skipping "$s" && continue
  case $s in
    cuda-tests) run_stage cuda_tests "${CUDA_TESTS_S:-200}" "PYTHONPATH=src python -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_linalg_cuda_gpu.py -k \"${CUDA_TESTS_K:-not nothing}\"" ;;
    cuda-probe) run_stage cuda_probe "${CUDA_PROBE_S:-300}" "PYTHONPATH=src python bench/cuda_probe.py --quick --ns ${CUDA_NS:-4,8,16,32} --out \$OUT/cuda_probe.json" ;;
    cuda-agree)
      AGREE="$TUNE --ops potrf,posv --n 4,8,16,32 --max-arms 14"
      run_stage cuda_agree "${CUDA_AGREE_S:-330}" "$AGREE --seed 0 --samples \$OUT/a.jsonl --out \$OUT/a && $AGREE --seed 1 --samples \$OUT/b.jsonl --out \$OUT/b && PYTHONPATH=src python bench/linalg_pick_replay.py cross \$OUT/a.jsonl \$OUT/b.jsonl --rules median,low,low-blocks --out \$OUT/cross.json; PYTHONPATH=src python -m tunedb diff \$OUT/a/sm90/linalg.json \$OUT/b/sm90/linalg.json" ;;
    cuda-tune)
      run_stage cuda_tune "${CUDA_TUNE_S:-400}" "if [ -d .carry/nvmath ]; then bash bench/nvmath_install.sh; fi; $TUNE --ops trsv --n 4,8,16,32 --max-arms 14 --samples \$OUT/trsv.jsonl --base src/tunedb/db/sm90/linalg.json --out \$OUT/t1 && $TUNE --ops potrf --n 64 --max-arms ${CUDA_TUNE_ARMS:-6} --samples \$OUT/potrf64.jsonl --base \$OUT/t1/sm90/linalg.json --out \$OUT/t2 && $TUNE --ops posv --dtypes ${CUDA_POSV64_DTYPES:-fp64} --n 64 --max-arms ${CUDA_TUNE_ARMS:-6} --samples \$OUT/posv64.jsonl --base \$OUT/t2/sm90/linalg.json --out \$OUT/db/sm90/linalg.json && PYTHONPATH=src python bench/linalg_served.py --table \$OUT/db/sm90/linalg.json --ops dot,gemv,gemm,trsv,potrf,posv --max-n 128 --out \$OUT/served_all.json" ;;
    trsv-tune)
      run_stage trsv_tune "${TRSV_TUNE_S:-150}" "$TUNE --ops trsv --n 4,8,16,32 --max-arms 14 --samples \$OUT/trsv.jsonl --base src/tunedb/db/sm90/linalg.json --out \$OUT/db/sm90/linalg.json && PYTHONPATH=src python bench/linalg_served.py --table \$OUT/db/sm90/linalg.json --ops dot,gemv,gemm,trsv,potrf,posv --max-n 128 --out \$OUT/served_all.json" ;;
    *) bash "$HERE/device_s20.sh" "$s" ;;
  esac
done
echo "[device_s21] done in $(( $(date +%s) - T0 )) s"
