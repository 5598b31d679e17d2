# LibreYOLO developer commands. `make test` and `make demo` install what they need first.
PY ?= python3
TORCH_PIN = torch==2.14.1 torchvision==0.29.1
STAMP = .make-installed

.PHONY: install test test-fresh test-gpu lint demo docs bench-loader

$(STAMP): pyproject.toml
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e ".[test]"
	@touch $(STAMP)

install: $(STAMP)  ## idempotent: re-runs only when pyproject.toml changed

# The suite runs on every core (pytest-xdist, at most 4 workers; conftest.py gives each worker its
# share of torch's threads).
PYTEST_ARGS = -q -m "not gpu" --timeout=600 -n auto --maxprocesses=4 tests

test: install  ## the CPU suite (GPU tests are skipped without CUDA)
	$(PY) -m pytest $(PYTEST_ARGS)

# A new virtual environment outside the tree, so nothing the machine has preinstalled (a newer or
# older pytest) decides what the suite runs with; the test tools come from constraints-test.txt.
FRESH ?= $(or $(TMPDIR),/tmp)/libreyolo-test-venv

test-fresh:  ## the CPU suite in a fresh virtual environment (what a new machine resolves); CI runs this
	rm -rf $(FRESH)
	$(PY) -m venv $(FRESH)
	$(FRESH)/bin/python -m pip install -q $(TORCH_PIN)
	$(FRESH)/bin/python -m pip install -q -c constraints-test.txt -e ".[test]"
	PATH="$(FRESH)/bin:$$PATH" $(FRESH)/bin/python -m pytest $(PYTEST_ARGS)

# The GPU suite in lanes that each fit one device call of under 9 minutes (tests/gpu/conftest.py):
# LANE=train, whole, models, predict or profiler; without LANE, all of them in one run.
test-gpu:  ## on a CUDA machine with the deps present: GPU tests only (LANE=one lane), no install step
	PYTHONPATH=src $(PY) -m pytest -q -m gpu tests/gpu $(if $(LANE),--lane $(LANE)) --durations=15 --durations-min=1

lint: install
	$(PY) -m ruff check src tests benchmarks

# 60 epochs at 128 px with batch 8 reached mAP50 0.42 on the shapes val split in about 3 minutes
# on a 2-core CPU (docs/training-performance.md, "The demo"); a 3-epoch run at 320 px learned nothing.
demo: install  ## YOLOv9-t from scratch on the built-in shapes data: a few minutes on a 2-core CPU
	@best=$$(libreyolo train model=yolo9-t data=shapes epochs=60 imgsz=128 batch=8 nbs=8 workers=2 \
	    eval_interval=20 project=runs/demo) && printf '%s\n' "" "next:" \
	  "  libreyolo val model=$$best data=shapes               # its mAP again, per class" \
	  "  libreyolo profile run shapes --size t imgsz=128 batch=8  # why is a step slow, and which lever helps" \
	  "  on a CUDA GPU: add cuda_graph=true (and imgsz=640) to the train command" >&2

docs: install  ## regenerate docs/hyperparameters.md from the config
	libreyolo cfg --markdown > docs/hyperparameters.md

bench-loader: install
	$(PY) benchmarks/loader.py --workers 0 2 4
