#!/usr/bin/env bash
# Two stage lists side by side on a two-GPU machine, each on its own GPU and its own physical CPU
# cores, within one time budget; everything that comes back is packed into two archives (the
# device tool returns only a few files per call).
#
#   LANE_A="tests profile" LANE_B="bench-t8 bench-families" BUDGET=530 bash benchmarks/gpu_lanes.sh
#
# Eager steps are host-bound: their figures move with CPU contention. Lanes get disjoint physical
# cores (hyperthread siblings stay in one lane), but they still share caches and memory bandwidth:
# quote eager figures from a lane that ran alone (LANE_A="" runs lane B only).
set -u
out_final=${OUT:-gpu-results}
export DEADLINE=$(( $(date +%s) + ${BUDGET:-530} )) OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} OUT=/tmp/lanes
# A warm machine keeps /tmp between calls: start empty so the archives hold this call's results only.
rm -rf "$OUT" && mkdir -p "$OUT" "$out_final"
cd "$(dirname "$0")/.."
# Split the physical cores in two halves; each lane gets every logical CPU of its cores.
cpus() {  # cpus HALF(0|1) -> comma list of logical CPUs
  lscpu -p=CPU,CORE 2>/dev/null | grep -v '^#' | sort -t, -k2,2n -k1,1n | awk -F, -v half="$1" '
    { core[NR] = $2; cpu[NR] = $1; if (!($2 in seen)) { seen[$2] = 1; n++ } }
    END { cut = int(n / 2); k = 0; delete seen
          for (i = 1; i <= NR; i++) { if (!(core[i] in seen)) { seen[core[i]] = k++ }
            if ((seen[core[i]] >= cut) == half) list = list (list == "" ? "" : ",") cpu[i] }
          print list }'
}
pin() { local list; list=$(cpus "$1"); if [ -n "$list" ] && command -v taskset >/dev/null; then echo "taskset -c $list"; fi; }
pids=()
if [ -n "${LANE_A:-}" ]; then
  (CUDA_VISIBLE_DEVICES=0 $(pin 0) bash benchmarks/gpu_stages.sh $LANE_A > "$OUT/laneA.txt" 2>&1) & pids+=($!)
fi
if [ -n "${LANE_B:-}" ]; then
  gpu=1; [ -z "${LANE_A:-}" ] && gpu=0
  (CUDA_VISIBLE_DEVICES=$gpu $(pin 1) bash benchmarks/gpu_stages.sh $LANE_B > "$OUT/laneB.txt" 2>&1) & pids+=($!)
fi
wait "${pids[@]}"
cd "$OUT" && tar czf "$out_final/small.tgz" --exclude='*.html' --exclude='*trace*' . \
  && tar czf "$out_final/big.tgz" $(find . -name '*.html' -o -name '*trace*') 2>/dev/null
tail -c 3000 "$OUT"/laneA.txt 2>/dev/null; echo =====; tail -c 4000 "$OUT"/laneB.txt 2>/dev/null
