#!/usr/bin/env bash
# The GPU verification and benchmark runs, in stages that fit device calls of under 10 minutes.
#
#   bash benchmarks/gpu_stages.sh STAGE [STAGE ...]     (results go to $OUT, else ./gpu-results)
#
# Stages run in order on the GPU(s) CUDA_VISIBLE_DEVICES names. With DEADLINE=<epoch seconds>
# set, each stage is cut off (timeout) at the deadline and later stages are skipped, so a
# time-boxed device call still brings back everything that finished; a benchmark matrix writes
# its JSON after every (model, batch). On a two-GPU machine, benchmarks/gpu_lanes.sh runs two
# stage lists side by side (own GPU, own physical cores, one budget) and packs the results.
#
# Stages:
#   tests            every @pytest.mark.gpu test (tests/gpu); TESTS_K=EXPR selects (pytest -k)
#   tests:LANE       one lane of them (train, whole, models, predict, profiler: tests/gpu/conftest.py), what
#                    `make test-gpu LANE=...` runs; its log is gpu_tests_LANE.txt
#   profile          `libreyolo profile run` YOLOv9-t batch 8 at 640 float16, eager and graphed
#   profile-compile  `libreyolo profile run` YOLOv9-t batch 8 at 640 float16, eager, with compile=false and
#                    compile=true: the two kernel lists (profile.json) side by side; the compile arm's
#                    first step compiles (about 3 minutes with an empty inductor cache)
#   dip:MODEL:DATA:SEEDS  benchmarks/val_dip_probe.py, the seeds side by side (3 cores and workers=2 each,
#                    as a parity lane): per validation the EMA, the raw weights and both with BatchNorm
#                    statistics re-measured, in dip/MODEL_DATA_sSEED.json
#   bench-t8         bench step YOLOv9-t batch 8: fp32 / float16 / bfloat16, each eager and graphed,
#                    and float16 in NCHW (channels_last=false), eager and graphed
#   autotune         bench step batch 8 float16 graphed (ARMS=... for others) of AUTOTUNE_MODELS (default
#                    yolo9-t) with AUTOTUNE_SETTINGS (default cudnn_benchmark=false and cudnn_benchmark_limit
#                    1 / 3 / 10, torch's default): the warm-up's seconds (autotuning and capture) against
#                    the steady step, in autotune/MODEL_SETTING.json
#   bench-families   bench step YOLOX-t and RTMDet-t batch 8 float16, eager and graphed
#   bench-matrix     bench step YOLOv9-t batch 2, 32 and YOLOv9-s batch 2, 8, 32, six arms each
#   bench:MODEL:B    bench step MODEL at batch B, the six precision x graph arms (bench:yolo9-s:32);
#                    ARMS=a,b,... picks other arms
#   base:STAGE       STAGE run on the code in $BASE_SRC (a `src` folder of another commit, carried
#                    to the device), results under $OUT/base: a before/after comparison in one call
#   diag             host launch cost and an eager YOLOv9-t step's CPU time by op (benchmarks/host_diag.py)
#   ops              operators per step phase on CUDA, float16 autocast, b8 at 640 (benchmarks/op_count.py)
#   bench-families-bs  bench step YOLOX-t and RTMDet-t batch 2 and 32 float16, eager and graphed
#   bench-cls        bench step ResNet-18 and MobileNetV4-s batch 16 at 224 on shapes-cls: fp32 and float16,
#                    each eager and graphed (peak memory in the records)
#   train-cls        ResNet-18 and MobileNetV4-s from scratch on shapes-cls at 224, float16, graphed,
#                    CLS_EPOCHS epochs (default 30): wall time and top-1
#   predict-bench    predict images/s and latency, YOLOv9-t, YOLOX-t, RTMDet-t at 640 float16, batch 1, 8, 32,
#                    eager and graphed, pre/post-processing included (benchmarks/predict_bench.py); with
#                    PEER=1 the peer's predict on YOLOv9-t as a reference row (needs .whl/peer)
#   profile-infer    `libreyolo profile infer` YOLOv9-t batch 1 at 640 float16, eager and graphed
#   whatif           `profile what-if` validated: for WHATIF_MODELS (default yolo9-t yolox-t rtmdet-t) at
#                    WHATIF_BATCHES (default 2 8), float16 at 640, the graphed step predicted from an eager
#                    `profile run` window against the one `bench step` measures (benchmarks/whatif_validate.py):
#                    whatif/whatif_validate.json (+ .md) and each eager profile.json in whatif/profiles/;
#                    WHATIF_LEVER=full validates cuda_graph=full against float16+full (whatif_validate_full.*)
#   bench-detr       bench step for the DETRs (DETR_MODELS, default $detrs below: RF-DETR and DEIMv2 pico/n by name) at batches DETR_BATCHES
#                    (default 2 4 8), 640: float16 eager and graphed, fp32 where the family's recipe
#                    trains without AMP (D-FINE, DEIM, RT-DETRv4); 16 steps after 6 warm-up
#   bench-full       cuda_graph=full against true: the bench-detr list of DETRs at FULL_BATCHES (default 4 8), YOLOv9-t, YOLOX-t
#                    and RTMDet-t at 8, yolo9-t with full+compile too (FULL_MODELS replaces the whole list);
#                    float16, fp32 where the recipe trains without AMP; step_full_MODEL.json (REPEAT=3 for
#                    the targets)
#   handoff          the eager step with gradients handed over (optim.GradHandoff) against autograd's
#                    per-parameter adds: YOLOv9-t, YOLOX-t, RTMDet-t at batch 8, 640, fp32
#                    (benchmarks/grad_handoff.py), handoff/MODEL.json
#   assign           the Hungarian solvers at 8 images x 1-7 output sets x 10-100 targets x 300 queries
#                    (benchmarks/assign_bench.py)
#   train-detr       the DETRs (DETR_MODELS, default as bench-detr) from scratch on the 800/100 generated set at DETR_IMGSZ
#                    (default 320), DETR_EPOCHS (default 12) epochs, batch 16, graphed, multi_scale off;
#                    DETR_PARALLEL=1 trains them side by side on the one GPU (their steps are
#                    host-bound, so this takes about the time of one; wall times are then shared),
#                    DETR_WORKERS loader workers each (default 8)
#   train800:MODEL:E1,E2  MODEL from scratch on the 800/100 generated set at 640, batch 16, graphed, at
#                    the family defaults, one run per epoch count (train800:yolonas-s:5,30): results.csv,
#                    wall time; TRAIN_WORKERS loader workers (default 8)
#   bench-dense      bench step for the segmenters and FOMO: FOMO-0.35 at batch 8 and 32 in float32
#                    (its recipe's precision), SegFormer-b0 (float16) and LingBot-Vision-s (bfloat16, its
#                    recipe's) at batch 8, each eager and graphed, at DENSE_IMGSZ (default: each
#                    family's own, 96 / 512 / 512); DENSE_MODELS picks some (default all three)
#   train-dense      SegFormer-b0 and LingBot-Vision-s from scratch on shapes-seg (128 px) and FOMO-0.35
#                    on shapes (96 px), graphed, side by side on the one GPU, DENSE_EPOCHS epochs
#                    (default 50; FOMO at least its recipe's 60), validated every 10: mIoU, F1
#   train-yolo9      YOLOv9-t from scratch on shapes at 640, float16, eager, 100 epochs
#   train-yolox      YOLOX-t from scratch on shapes at 640, float16, graphed (capture invalidated
#                    and re-taken when the L1 branch turns on at no_aug_epochs)
#   train-rtmdet     RTMDet-t from scratch on shapes at 640, float16, eager
#   yolox-invalidate YOLOX-t graphed, 12 epochs with no_aug_epochs=4: capture, invalidate, re-capture
#   finetune         YOLOv9-t: 40 epochs from scratch, then 20-epoch fine-tunes at batch 8, 640,
#                    workers 4: eager (seeds 0 and 1) and graphed (seed 0); wall time + mAP
#   tta:E:ARMS:SEEDS time to accuracy (benchmarks/time_to_accuracy.py), E epochs on the 800/100
#                    generated set at 640, batch 8, workers 8: ARMS comma-separated (ours-graph,
#                    ours-eager, ours-sgd-graph, peer-default, peer-sgd), SEEDS comma-separated;
#                    TTA_EXTRA="key=value ..." goes to our arms; results tta_E_<ARMS>.json/.md
#   parity:ARMS:SEEDS:LANES  accuracy at the defaults on the seven generated data regimes, ours against
#                    the peer, each given only what a user types (benchmarks/parity.py): ARMS comma-
#                    separated (ours, peer, ours@yolox-t, ours+recipe=published, ...), SEEDS comma-separated,
#                    LANES runs side by side on the one GPU, each pinned to its share of the cores;
#                    PARITY_REGIMES=a,b picks regimes; results parity_<ARMS>.json/.md and the run logs
#   ddp              multi-GPU scaling (needs 2 GPUs; run it alone, not in a lane): YOLOv9-t at 640,
#                    float16, batch 16 per GPU on the 800/100 generated set, 1 GPU (device=0) against
#                    2 (batch=32 device=0,1, DDP under the elastic launcher), DDP_EPOCHS epochs
#                    (default 10), seeds DDP_SEEDS (default "0 1"): images/s, scaling efficiency and
#                    mAP at equal epochs in ddp_scaling.json/.md (benchmarks/ddp_scaling.py). NCCL's
#                    settings come from the machine's environment (NVLink multicast stays off). Then
#                    the scaling model's prediction against it: ddp_scaling_check.json/.txt
#                    (benchmarks/scaling_model.py --check)
#
# REPEAT=N runs every bench arm N times (arms interleaved) and records the run-to-run spread.
#
# Missing packages travel as wheels (see the device tool's README): .whl/base/ (faster-coco-eval,
# plotly, torch-linear-assignment; the machine has SciPy and timm) goes on our PYTHONPATH;
# .whl/peer/ (the peer trainer, ultralytics, and what it needs) into its own folder that only the
# peer's runs see. A DIR may also hold NAME.tar.xz: an unpacked wheel's files, unpacked into the
# same folder. polars' runtime travels that way (33 MB in xz against 54 MB as a wheel), so the
# peer's packages and ours fit one call's 64 MiB: `unzip -q WHEEL -d /tmp/w && tar cJf
# .whl/peer/NAME.tar.xz -C /tmp/w .` Each arm of
# `bench step` is its own process; its record carries `stage_seconds` so a slow arm shows where
# its time went.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-results}
mkdir -p "$out"
gpu=${CUDA_VISIBLE_DEVICES:-all}
install_wheels() {  # install_wheels DIR TARGET: once per machine; a second lane waits for the first
  [ -n "$(ls "$1"/*.whl "$1"/*.tar.xz 2>/dev/null)" ] || return 0
  [ -e "$2/.done" ] && return 0
  mkdir -p "$2"
  if mkdir "$2/.lock" 2>/dev/null; then
    # A failed install takes its lock away, so that a lane waiting for it stops too (and a rerun retries).
    if ls "$1"/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$2" "$1"/*.whl \
        || { rmdir "$2/.lock"; exit 1; }
    fi
    for t in "$1"/*.tar.xz; do [ -e "$t" ] && { tar xJf "$t" -C "$2" || { rmdir "$2/.lock"; exit 1; }; }; done
    touch "$2/.done"
  else
    while [ ! -e "$2/.done" ]; do
      [ -d "$2/.lock" ] || { echo "installing $1 failed in the other lane" >&2; exit 1; }
      sleep 1
    done
  fi
}
install_wheels .whl/base /tmp/site
install_wheels .whl/peer /tmp/peer-site
# The peer's interpreter: the same python3 with the peer's packages in front.
printf '#!/bin/sh\nPYTHONPATH=/tmp/peer-site:/tmp/site exec python3 "$@"\n' > /tmp/peer-python
chmod +x /tmp/peer-python
export PYTHONPATH=$PWD/src:/tmp/site BASE_SRC=${BASE_SRC:+$(realpath "$BASE_SRC")}
export LIBREYOLO_CACHE=${LIBREYOLO_CACHE:-/tmp/libreyolo-cache} PYTHONUNBUFFERED=1
# Both lanes need the dataset: generation is atomic, so a race only wastes a second.
# Validation needs faster-coco-eval: a run that cannot import it fails only at its last epoch.
python3 -c "import faster_coco_eval; from libreyolo.data import load_data_config; load_data_config('shapes')" || exit 1

runs=/tmp/runs-gpu$gpu
matrix() {  # matrix NAME ARGS...: bench step over models x batches, JSON after each pair
  local name=$1; shift
  python3 benchmarks/step_matrix.py "$@" --repeat "${REPEAT:-1}" --out "$out/$name.json" > "$out/$name.md"
}
train() {  # train NAME KEY=VALUE...: a training run; its results.csv and log come back
  local name=$1; shift
  local t0=$EPOCHREALTIME
  python3 -m libreyolo train data="${DATA:-shapes}" project="$runs" name="$name" exist_ok=true "$@" \
    > "$out/$name.log" 2>&1
  local rc=$?
  echo "{\"name\": \"$name\", \"rc\": $rc, \"wall_s\": $(awk "BEGIN{print $EPOCHREALTIME - $t0}")}" >> "$out/walltimes.jsonl"
  cp "$runs/$name/results.csv" "$out/$name.csv" 2>/dev/null
  grep -E "CUDA graph|precision:|cuda_graph|invalidated|skipped|non-finite" "$out/$name.log" | head -20
  tail -3 "$out/$name.log"
}
recipe_precision() {  # recipe_precision MODEL: fp32 where the family's recipe trains without AMP, else float16
  python3 -c "from libreyolo.model import LibreYOLO; print('float16' if LibreYOLO('$1').source.defaults.get('amp', True) else 'fp32')"
}
six=fp32,fp32+graph,float16,float16+graph,bfloat16,bfloat16+graph
detrs="rtdetr-r18 rtdetrv2-r18 dfine-n dfine-s deim-n deim-s rtdetrv4-s deimv2-atto deimv2-femto ec-s ec-m"

pack_logs() {  # pack_logs STAGE FILE: the run logs of a tta or parity stage, at its end or when the deadline cut it
  case $1 in
    # nullglob: a peer-only run has no timings.json, and tar exits 2 on a pattern that matched nothing
    tta:*) (cd /tmp/tta 2>/dev/null && shopt -s nullglob && tar czf "$2" *.log */timings.json */results.csv) ;;
    parity:*) (cd /tmp/parity 2>/dev/null && tar czf "$2" logs) ;;
  esac
}

stage_run() {
  case "$1" in
    tests|tests:*)
      lane=${1#tests}; lane=${lane#:}
      python3 -m pytest -q -m gpu tests/gpu -rA -p no:cacheprovider ${lane:+--lane "$lane"} --durations=0 \
        --durations-min=1 ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tee "$out/gpu_tests${lane:+_$lane}.txt" | tail -60 ;;
    profile)
      for arm in eager graph; do
        extra="cuda_graph=false"; [ "$arm" = graph ] && extra="cuda_graph=true"
        (cd /tmp && python3 -m libreyolo profile run shapes --size t imgsz=640 batch=8 amp_dtype=float16 \
          workers=8 project="$runs/profile-$arm" $extra > "$out/profile_$arm.log" 2>&1)
        d=$(ls -d "$runs/profile-$arm"/prof* | tail -1)
        mkdir -p "$out/profile_$arm" && cp "$d"/profile.json "$d"/profile_summary.json "$d"/timeline.html "$out/profile_$arm/"
        gzip -c "$d/profile_trace.json" > "$out/profile_$arm/profile_trace.json.gz"
        tail -30 "$out/profile_$arm.log"
      done ;;
    profile-compile)
      for arm in eager compile; do
        extra="compile=false"; [ "$arm" = compile ] && extra="compile=true"
        (cd /tmp && python3 -m libreyolo profile run shapes --size t imgsz=640 batch=8 amp_dtype=float16 \
          workers=8 cuda_graph=false project="$runs/profile-$arm" $extra > "$out/profile_$arm.log" 2>&1)
        d=$(ls -d "$runs/profile-$arm"/prof* | tail -1)
        mkdir -p "$out/profile_$arm" && cp "$d"/profile.json "$d"/profile_summary.json "$out/profile_$arm/"
        tail -30 "$out/profile_$arm.log"
      done ;;
    dip:*:*:*)
      IFS=: read -r _ model data seeds <<< "$1"
      mkdir -p "$out/dip"
      i=0
      for s in ${seeds//,/ }; do
        taskset -c $((3 * i))-$((3 * i + 2)) python3 benchmarks/val_dip_probe.py --model "$model" --data "$data" \
          --seed "$s" --project "$runs/dip" --out "$out/dip/${model}_${data}_s$s.json" workers=2 \
          > "$out/dip/${model}_${data}_s$s.log" 2>&1 &
        i=$((i + 1))
      done
      wait
      tail -n 5 "$out"/dip/*.log ;;
    bench-t8)
      matrix step_yolo9t_b8 --models yolo9-t --batches 8 --arms $six,float16+nchw,float16+nchw+graph ;;
    autotune)
      # cuDNN autotuning's cost against what it buys: the warm-up steps (where every convolution
      # shape is timed, and the graph captured) and the steady step, at each algorithm limit
      mkdir -p "$out/autotune"
      for m in ${AUTOTUNE_MODELS:-yolo9-t}; do
        for v in ${AUTOTUNE_SETTINGS:-cudnn_benchmark=false cudnn_benchmark_limit=1 cudnn_benchmark_limit=3 cudnn_benchmark_limit=10}; do
          f="$out/autotune/${m}_${v/=/_}"
          python3 -m libreyolo bench step model="$m" batch=8 imgsz=640 $v --arms ${ARMS:-float16+graph} --json \
            > "$f.json" 2> "$f.log"
          python3 -c "import json,sys; [print(sys.argv[1], r['arm'], 'warm-up s', r['stage_seconds']['warmup'], 'median ms',
            r['step_ms_median'], 'busy ms', r['kernel_busy_ms']) for r in json.load(open(sys.argv[2]))]" "$m $v" "$f.json"
        done
      done ;;
    bench-families)
      matrix step_families_b8 --models yolox-t rtmdet-t --batches 8 --arms float16,float16+graph ;;
    bench-matrix)
      matrix step_yolo9t_b2_b32 --models yolo9-t --batches 2 32 --arms $six
      matrix step_yolo9s --models yolo9-s --batches 8 2 32 --arms $six ;;
    bench-cls)
      matrix step_classifiers_b16 --models resnet18 mobilenetv4-s --batches 16 --imgsz 224 --data shapes-cls \
        --arms fp32,fp32+graph,float16,float16+graph ;;
    train-cls)
      for m in resnet18 mobilenetv4-s; do
        DATA=shapes-cls train "cls_$m" model=$m epochs=${CLS_EPOCHS:-30} batch=64 workers=8 amp_dtype=float16 \
          cuda_graph=true
      done ;;
    predict-bench)
      YOLO_CONFIG_DIR=/tmp/peer-cfg python3 benchmarks/predict_bench.py --models ${PREDICT_MODELS:-yolo9-t yolox-t rtmdet-t} \
        --batches ${PREDICT_BATCHES:-1 8 32} --arms eager,graph ${PEER:+--peer-python /tmp/peer-python} \
        --out "$out/predict_bench.json" > "$out/predict_bench.md"
      cat "$out/predict_bench.md"
      # conf 1e-6, below every score of a from-scratch model: every anchor reaches NMS and each
      # image keeps max_det=300 boxes, the heaviest post-processing predict can meet
      YOLO_CONFIG_DIR=/tmp/peer-cfg python3 benchmarks/predict_bench.py --models yolo9-t --batches 1 32 \
        --arms graph --conf 0.000001 ${PEER:+--peer-python /tmp/peer-python} \
        --out "$out/predict_bench_allboxes.json" > "$out/predict_bench_allboxes.md"
      cat "$out/predict_bench_allboxes.md" ;;
    profile-infer)
      for arm in eager graph; do
        extra=""; [ "$arm" = graph ] && extra="cuda_graph=true"
        (cd /tmp && python3 -m libreyolo profile infer yolo9-t --batch 1 --imgsz 640 amp_dtype=float16 \
          project="$runs/profile-infer-$arm" $extra > "$out/profile_infer_$arm.log" 2>&1)
        d=$(ls -td "$runs/profile-infer-$arm"/* | head -1)  # the newest run
        mkdir -p "$out/profile_infer_$arm" && cp "$d"/profile.json "$d"/profile_summary.json "$out/profile_infer_$arm/"
        tail -30 "$out/profile_infer_$arm.log"
      done ;;
    whatif)
      mkdir -p "$out/whatif"
      lever=${WHATIF_LEVER:-graph}; tag=$([ "$lever" = graph ] && echo "" || echo "_$lever")
      python3 benchmarks/whatif_validate.py --models ${WHATIF_MODELS:-yolo9-t yolox-t rtmdet-t} \
        --batches ${WHATIF_BATCHES:-2 8} --lever "$lever" --work /tmp/whatif \
        --out "$out/whatif/whatif_validate$tag.json" > "$out/whatif/whatif_validate$tag.md"
      cat "$out/whatif/whatif_validate$tag.md" ;;
    bench-families-bs)
      matrix step_families_b2_b32 --models yolox-t rtmdet-t --batches 2 32 --arms float16,float16+graph ;;
    bench-detr)
      for m in ${DETR_MODELS:-$detrs}; do
        p=$(recipe_precision "$m")
        arms=$p,$p+graph
        matrix "step_$m" --models "$m" --batches ${DETR_BATCHES:-2 4 8} --arms $arms --steps 16 --warmup 6
        cat "$out/step_$m.md"
      done ;;
    bench-full)
      # cuda_graph=full against true, the targets of docs/training-performance.md's whole-step section:
      # the DETRs at FULL_BATCHES (default 4 8), the YOLO families at 8 (yolo9-t with full+compile too)
      for m in ${FULL_MODELS:-$detrs yolo9-t yolox-t rtmdet-t}; do
        p=$(recipe_precision "$m")
        arms=$p+graph,$p+full batches=${FULL_BATCHES:-4 8}
        case "$m" in yolo9-t) arms=$arms,$p+full+compile batches=8 ;; yolox-t|rtmdet-t) batches=8 ;; esac
        matrix "step_full_$m" --models "$m" --batches $batches --arms "$arms"
        cat "$out/step_full_$m.md"
      done ;;
    handoff)
      mkdir -p "$out/handoff"
      for m in yolo9-t yolox-t rtmdet-t; do
        python3 benchmarks/grad_handoff.py --device cuda --model "$m" --batch 8 --imgsz 640 --steps 40 \
          --json "$out/handoff/$m.json" | tail -12
      done ;;
    assign)
      python3 benchmarks/assign_bench.py --device cuda --sets 1,4,7 --boxes 10,37,100 --out "$out/assign_bench.json" \
        | tail -3 ;;
    train-detr)
      data=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; \
from time_to_accuracy import make_data; print(make_data(Path('/tmp/tta'), 800, 100))")
      for m in ${DETR_MODELS:-$detrs}; do
        DATA=$data train "detr_$m" model="$m" imgsz=${DETR_IMGSZ:-320} batch=16 nbs=16 epochs=${DETR_EPOCHS:-12} \
          workers=${DETR_WORKERS:-8} eval_interval=${DETR_EPOCHS:-12} cuda_graph=true multi_scale=false &
        [ -n "${DETR_PARALLEL:-}" ] || wait
      done
      wait ;;
    train800:*:*)
      IFS=: read -r _ m es <<< "$1"  # $1: under DEADLINE the stage runs in a child bash
      data=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; \
from time_to_accuracy import make_data; print(make_data(Path('/tmp/tta'), 800, 100))")
      for e in ${es//,/ }; do
        DATA=$data train "${m}_${e}ep" model="$m" imgsz=640 batch=16 epochs=$e workers=${TRAIN_WORKERS:-8} \
          eval_interval=$e cuda_graph=true
      done ;;
    bench-dense)
      for m in ${DENSE_MODELS:-fomo-035 segformer-b0 lingbot-s}; do
        case $m in
          fomo-035) matrix step_fomo-035 --models fomo-035 --batches 8 32 --arms fp32,fp32+graph \
                      --imgsz ${DENSE_IMGSZ:-96} ;;
          segformer-b0) matrix step_segformer-b0 --models segformer-b0 --batches 8 --arms float16,float16+graph \
                          --data shapes-seg --imgsz ${DENSE_IMGSZ:-512} ;;
          lingbot-s) matrix step_lingbot-s --models lingbot-s --batches 8 --arms bfloat16,bfloat16+graph \
                       --data shapes-seg --imgsz ${DENSE_IMGSZ:-512} ;;
          *) echo "bench-dense: unknown model '$m'" >&2; return 2 ;;
        esac
        cat "$out/step_$m.md"
      done ;;
    train-dense)
      # shapes-seg is 128 px: the segmenters train at that size, and their recipes' 1500 warm-up
      # iterations (of 160k / 40k) become 100 of this run's ~650.
      e=${DENSE_EPOCHS:-50}
      DATA=shapes-seg train seg_segformer-b0 model=segformer-b0 imgsz=128 epochs=$e warmup_iters=100 \
        eval_interval=10 workers=4 cuda_graph=true &
      DATA=shapes-seg train seg_lingbot-s model=lingbot-s imgsz=128 epochs=$e warmup_iters=100 \
        eval_interval=10 workers=4 cuda_graph=true &
      DATA=shapes train points_fomo-035 model=fomo-035 epochs=$(( e > 60 ? e : 60 )) eval_interval=10 workers=4 \
        cuda_graph=true &
      wait ;;
    train-yolo9)
      train yolo9t_640 model=yolo9-t imgsz=640 batch=16 nbs=16 epochs=100 workers=8 eval_interval=10 amp_dtype=float16 \
        cuda_graph=false ;;
    train-yolox)
      train yoloxt_640 model=yolox-t imgsz=640 batch=16 nbs=16 epochs=120 workers=8 eval_interval=10 \
        amp_dtype=float16 mixup=0 cuda_graph=true ;;
    train-rtmdet)
      train rtmdett_640 model=rtmdet-t imgsz=640 batch=16 nbs=16 epochs=120 workers=8 eval_interval=10 amp_dtype=float16 \
        cuda_graph=false ;;
    yolox-invalidate)
      train yoloxt_invalidate model=yolox-t imgsz=640 batch=16 nbs=16 epochs=12 no_aug_epochs=4 workers=8 \
        eval_interval=12 amp_dtype=float16 mixup=0 cuda_graph=true ;;
    finetune)
      train pre_yolo9t model=yolo9-t imgsz=640 batch=16 nbs=16 epochs=40 workers=8 eval_interval=40 amp_dtype=float16
      for run in "eager 0" "graph 0" "eager 1"; do
        set -- $run
        extra="cuda_graph=false"; [ "$1" = graph ] && extra="cuda_graph=true"
        train "ft_$1_seed$2" model="$runs/pre_yolo9t/weights/best.pt" imgsz=640 batch=8 nbs=8 epochs=20 workers=4 \
          eval_interval=20 amp_dtype=float16 seed="$2" $extra
      done ;;
    tta:*:*:*)
      IFS=: read -r _ epochs arms seeds <<< "$1"
      tag=tta_${epochs}_$(printf %s "$arms" | tr -c 'A-Za-z0-9' '-')  # file names: letters, digits, -
      YOLO_CONFIG_DIR=/tmp/peer-cfg python3 benchmarks/time_to_accuracy.py --arms "$arms" \
        --epochs "$epochs" --seeds ${seeds//,/ } --work /tmp/tta --peer-python /tmp/peer-python \
        --ours-extra ${TTA_EXTRA:-} --out "$out/$tag.json" > "$out/$tag.md"
      cat "$out/$tag.md"
      pack_logs "$1" "$out/${tag}_logs.tgz" ;;
    parity:*:*:*)
      IFS=: read -r _ arms seeds lanes <<< "$1"
      tag=parity_$(printf %s "$arms" | tr -c 'A-Za-z0-9' '-')
      YOLO_CONFIG_DIR=/tmp/peer-cfg python3 benchmarks/parity.py --arms "$arms" --seeds ${seeds//,/ } \
        --lanes "$lanes" --work /tmp/parity --peer-python /tmp/peer-python --out "$out/$tag.json" \
        ${PARITY_REGIMES:+--regimes "$PARITY_REGIMES"} > "$out/$tag.md" 2> "$out/$tag.err"
      cat "$out/$tag.md"
      pack_logs "$1" "$out/${tag}_logs.tgz" ;;
    ddp)
      n=$(python3 -c "import torch; print(torch.cuda.device_count())")
      if [ "$n" -lt 2 ]; then echo "SKIPPED ddp: $n GPU(s) visible, it needs 2" | tee -a "$out/skipped.txt"; return 0; fi
      python3 benchmarks/ddp_scaling.py --epochs "${DDP_EPOCHS:-10}" --seeds ${DDP_SEEDS:-0 1} --workers 8 \
        --work /tmp/ddp --out "$out/ddp_scaling.json" > "$out/ddp_scaling.md" 2>&1
      tail -3 "$out/ddp_scaling.md"
      python3 benchmarks/scaling_model.py --check "$out/ddp_scaling.json" --json "$out/ddp_scaling_check.json" \
        > "$out/ddp_scaling_check.txt" 2>&1
      cat "$out/ddp_scaling_check.txt"
      (cd /tmp/ddp && tar czf "$out/ddp_logs.tgz" *.log */timings.json */results.csv 2>/dev/null) ;;
    bench:*:*)
      IFS=: read -r _ model batch <<< "$1"
      matrix "step_${model}_b$batch" --models "$model" --batches "$batch" --arms "${ARMS:-$six}" ;;
    base:*)
      [ -d "${BASE_SRC:-}/libreyolo" ] || { echo "base:* needs BASE_SRC=<a src folder>" >&2; return 2; }
      mkdir -p "$out/base"
      (export out=$out/base PYTHONPATH=$BASE_SRC:/tmp/site; stage_run "${1#base:}") ;;
    diag)
      python3 benchmarks/host_diag.py > "$out/host_diag.txt" 2>&1; head -8 "$out/host_diag.txt" ;;
    ops)
      python3 benchmarks/op_count.py --device cuda --batch 8 --imgsz 640 --json "$out/op_count_cuda.json" \
        | tee "$out/op_count_cuda.md" ;;
    *)
      echo "unknown stage '$1'" >&2; return 2 ;;
  esac
}

for stage in "$@"; do
  if [ -n "${DEADLINE:-}" ]; then
    left=$(( DEADLINE - $(date +%s) ))
    if [ "$left" -le 5 ]; then echo "SKIPPED $stage (deadline)" | tee -a "$out/skipped.txt"; continue; fi
    echo "== $stage on GPU $gpu ($left s left)"
    export -f stage_run matrix train recipe_precision pack_logs; export out runs six detrs
    timeout "$left" bash -c "stage_run $stage" || {
      echo "stage $stage ended rc=$? (124 = deadline)" | tee -a "$out/skipped.txt"; pack_logs "$stage" "$out/cut_logs.tgz"; }
  else
    echo "== $stage on GPU $gpu"
    stage_run "$stage"
  fi
done
