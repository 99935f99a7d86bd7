#!/usr/bin/env bash
# Nsight Compute over CUDA-tier linalg cells (bench/linalg_ncu.py launches each): for each
# "op:dtype:n:arm:batch[:min_blocks]" in NCU_CELLS, a report of one launch (--set full, clocks left
# alone), its details page as text and its SASS with stall samples as CSV (gzipped), under $OUT.
set -u
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 2; }
"$NCU" --version | tail -n 1
for spec in ${NCU_CELLS:-potrf:fp32:64:cuda_p1_w2:16384 posv:fp64:64:cuda_p1_w2:16384 potrf:fp32:128:cudat_t8:4096 posv:fp32:128:cudat_t8:4096 posv:fp64:128:cudat_t4:4096 posv:fp32:32:cudas_p2_w2:4096}; do
  IFS=: read -r op dt n arm batch mb <<< "$spec"
  name="ncu_${op}_${dt}_n${n}_${arm}_b${batch}${mb:+_mb$mb}"
  echo "== $name"
  "$NCU" --clock-control none -k tunedb_linalg --launch-skip 1 --launch-count 1 --set full \
    --import-source no -f -o "$OUT/$name" \
    python bench/linalg_ncu.py --op "$op" --dtype "$dt" --n "$n" --arm "$arm" --batch "$batch" \
    --min-blocks "${mb:-0}" 2>&1 | tail -n 3
  if [ -f "$OUT/$name.ncu-rep" ]; then
    "$NCU" -i "$OUT/$name.ncu-rep" --page details > "$OUT/$name.txt" 2>&1
    "$NCU" -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$OUT/$name.sass.csv.gz"
    grep -E "Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Block Limit|Duration|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps" "$OUT/$name.txt" | head -n 20
    rm -f "$OUT/$name.ncu-rep"
  fi
done
