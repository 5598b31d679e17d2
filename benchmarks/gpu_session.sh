#!/usr/bin/env bash
# The GPU verification and benchmark runs, in stages that each fit one device call (<10 min).
#
#   bash benchmarks/gpu_session.sh STAGE [STAGE ...]     (results go to $OUT, else ./gpu-results)
#
# Stages:
#   tests     make test-gpu (every @pytest.mark.gpu test)                           ~2 min
#   bench-t8  bench step, YOLOv9-t batch 8 at 640: fp32, float16, bfloat16          ~2 min
#   bench     bench step, YOLOv9-t and -s at batch 2/8/32, float16 and bfloat16    ~8 min
#   train     YOLOv9-t from scratch on shapes at 640, float16, 100 epochs          ~3 min
#
# On the device machine, missing packages travel as wheels in .whl/ (see the device tool's README):
# faster-coco-eval and plotly. Each arm of `bench step` is its own process; its record carries
# `stage_seconds` (setup, warm-up, timed, profiled, synced) so a slow arm shows where time went.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-results}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=$PWD/src:/tmp/site
else
  export PYTHONPATH=$PWD/src
fi
export LIBREYOLO_CACHE=${LIBREYOLO_CACHE:-/tmp/libreyolo-cache} PYTHONUNBUFFERED=1
python3 -c "from libreyolo.data import load_data_config; load_data_config('shapes')" || exit 1

for stage in "$@"; do
  case "$stage" in
    tests)
      python3 -m pytest -q -m gpu tests/gpu -rA 2>&1 | tee "$out/gpu_tests.txt" | tail -40 ;;
    bench-t8)
      python3 benchmarks/step_matrix.py --models yolo9-t --batches 8 --arms fp32,float16,bfloat16 \
        --out "$out/step_yolo9t_b8.json" ;;
    bench)
      python3 benchmarks/step_matrix.py --models yolo9-t yolo9-s --batches 2 8 32 --arms float16,bfloat16 \
        --out "$out/step_matrix.json" ;;
    train)
      (cd /tmp && python3 -m libreyolo train model=yolo9-t data=shapes imgsz=640 batch=16 nbs=16 epochs=100 \
        workers=8 eval_interval=10 amp_dtype=float16 name=t640 exist_ok=true 2>&1 | grep -v '^epoch' | tail -5)
      cp /tmp/runs/train/t640/results.csv "$out/train_yolo9t_shapes640.csv" ;;
    *)
      echo "unknown stage '$stage' (tests, bench-t8, bench, train)" >&2; exit 2 ;;
  esac
done
