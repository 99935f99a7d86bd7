#!/usr/bin/env bash
# Session 13's MoE / bmm device stages (issue 24): the shipped bmm and group_gemm tables and the
# exhaustive-grid regret of the group_gemm table. Stages by name, each under its own timeout,
# logs under $OUT/logs (packed into $OUT/logs.tgz); built tables copied to $OUT/db/.
#   bash bench/device_s13_moe.sh bmm-table moe-table moe-exhaustive    (from the repository root)
# Expected on one H200 (16 cores), cold Triton cache: bmm-table ~50 s (prewarm ~25, build ~25),
# moe-table ~240 s (census ~15, prewarm ~35, Qwen3 build ~50, Mixtral build ~140-165),
# moe-exhaustive <= ~190 s (compile 50-70, no new point after EXH_BUDGET=160 s, then pass 2 of
# what is left and the write; it scores the table moe-table just built): about 480 s in all.
# Knobs: MOE_MIXTRAL_TOKENS / MOE_QWEN3_TOKENS (census sizes of the build), MIXTRAL_S (the Mixtral
# build's limit: 822 arms did not finish in 230 s in session 14; give it a call of its own), EXH_BUDGET (s after
# which the exhaustive bench starts no new point), EXH_MODELS.
. "$(dirname "$0")/device_stages.sh"
record_env
# one Triton cache for the prewarm processes, the build's measuring worker and the benches (the
# GEMM launcher, if some import pulls it in, would otherwise move the worker to tunedb's own cache)
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$HOME/.cache/tunedb/triton}
BMM_CENSUS="--census bench/census/bmm/whisper-base_b1.json --census bench/census/bmm/whisper-large-v3_b1.json"
for s in "$@"; do
  case $s in
    bmm-table)  # docs/bmm.md: the 4 batch-1 whisper attention keys, every valid tile at the census M
      stage bmm_prewarm 90 "python bench/prewarm.py --family bmm $BMM_CENSUS --no-fill"
      stage bmm_build 150 "python -m tunedb build --family bmm $BMM_CENSUS --no-fill --out system --fresh --run-id s13-bmm && cp src/tunedb/db/sm90/bmm.json $FINAL/db/" ;;
    moe-table)  # docs/group_gemm.md: Qwen3 first (cheap), then Mixtral merged into the same file
      stage moe_census 60 "python -c 'import sys; from tunedb.families.group_gemm.moe import census, meta_model; from tunedb.census.censusfile import write_census
for name, tokens, path in ((\"qwen3-30b-a3b\", sys.argv[1], sys.argv[2]), (\"mixtral-8x7b\", sys.argv[3], sys.argv[4])):
    shapes = census(meta_model(name, layers=1), [int(t) for t in tokens.split(\",\")], workload=name); write_census(path, shapes); print(name, len(shapes.points), \"points ->\", path)
' ${MOE_QWEN3_TOKENS:-1,4,16,64,128,256,1024,4096} $OUT/moe_census_qwen3.json ${MOE_MIXTRAL_TOKENS:-1,16,64,128,256,1024,4096} $OUT/moe_census_mixtral.json"
      stage moe_prewarm 100 "python bench/prewarm.py --family group_gemm --census $OUT/moe_census_qwen3.json --census $OUT/moe_census_mixtral.json --no-fill"
      stage moe_build_qwen3 100 "python -m tunedb build --family group_gemm --census $OUT/moe_census_qwen3.json --no-fill --out system --fresh --run-id s13-moe-qwen3 && cp src/tunedb/db/sm90/group_gemm.json $FINAL/db/"
      stage moe_build_mixtral ${MIXTRAL_S:-230} "python -m tunedb build --family group_gemm --census $OUT/moe_census_mixtral.json --no-fill --out system --run-id s13-moe-mixtral && cp src/tunedb/db/sm90/group_gemm.json $FINAL/db/" ;;
    moe-exhaustive)  # issue 24's regret goal; scores the table moe-table built when it is there
      TABLE=""; [ -f src/tunedb/db/sm90/group_gemm.json ] && TABLE="--table src/tunedb/db/sm90/group_gemm.json"
      stage moe_exhaustive 230 "python bench/moe_exhaustive.py --out $OUT/moe_exhaustive --models ${EXH_MODELS:-mixtral-8x7b,qwen3-30b-a3b} --budget-s ${EXH_BUDGET:-160} $TABLE" ;;
    *) echo "unknown stage $s" ;;
  esac
done
pack_logs
