"""Hook logic on a stand-in trainer: validation cadence, best tracking, early stopping."""

from types import SimpleNamespace

import pytest

from libreyolo.engine.hooks import ValidationHook
from libreyolo.tasks import get_task


def _trainer(scores, **cfg):
    it = iter(scores)
    t = SimpleNamespace(cfg=SimpleNamespace(**{"val": True, "eval_interval": 1, "epochs": 100, "patience": 3, **cfg}),
                        epoch=0, metrics={}, stop=False, validated_epoch=-1, task=get_task("detect"))

    def validate():
        t.validated_epoch = t.epoch
        return {"map50_95": (s := next(it)), "map50": s}

    t.validate = validate
    return t


def test_patience_stops_after_epochs_without_improvement():
    t = _trainer([0.1, 0.3, 0.2, 0.25, 0.29, 0.5])
    hook = ValidationHook()
    for epoch in range(6):
        t.epoch = epoch
        hook.after_epoch(t)
        if t.stop:
            break
    assert hook.best_epoch == 1 and t.epoch == 4  # epochs 2, 3, 4 did not beat epoch 1's 0.3
    assert t.stop
    assert hook.state_dict() == {"best_fitness": pytest.approx(0.3), "best_epoch": 1}
    again = ValidationHook()
    again.load_state_dict(hook.state_dict())  # a resume carries the best epoch on
    assert (again.best_fitness, again.best_epoch) == (hook.best_fitness, hook.best_epoch)


def test_patience_zero_never_stops_and_interval_skips():
    t = _trainer([0.5, 0.1, 0.1, 0.1], patience=0, eval_interval=2, epochs=8)
    hook = ValidationHook()
    validated = []
    for epoch in range(8):
        t.epoch = epoch
        hook.after_epoch(t)
        validated.append(t.validated_epoch == epoch)
    assert validated == [False, True, False, True, False, True, False, True]
    assert not t.stop and hook.best_epoch == 1


def test_last_epoch_always_validates():
    t = _trainer([0.2], eval_interval=10, epochs=3)
    t.epoch = 2
    hook = ValidationHook()
    hook.after_epoch(t)
    assert t.validated_epoch == 2 and hook.improved_at(2) and not hook.improved_at(1)


def test_classification_fitness_is_top1():
    t = _trainer([], patience=0)
    t.task = get_task("classify")
    results = iter([{"top1": 0.5, "top5": 1.0}, {"top1": 0.6, "top5": 0.6}, {"top1": 0.55, "top5": 1.0}])
    t.validate = lambda: next(results)
    hook = ValidationHook()
    for epoch in range(3):
        t.epoch = epoch
        hook.after_epoch(t)
    assert hook.best_epoch == 1 and hook.best_fitness == 0.6  # top-5 does not count


def test_skipped_steps_are_said_only_for_epochs_that_skipped(tmp_path, caplog):
    from libreyolo.engine.hooks import ResultsHook

    counts = iter([3, 8, 8, 8, 9])  # the scaler's running total: 3 before this run (a resume)
    t = SimpleNamespace(epoch=0, start_epoch=0, metrics={}, validated_epoch=-1, run_dir=tmp_path,
                        task=get_task("detect"),
                        epoch_losses=lambda: {"box": 1.0},
                        optimizer=SimpleNamespace(param_groups=[{"lr": 0.01}]),
                        precision=SimpleNamespace(skipped_steps=lambda: next(counts)))
    hook = ResultsHook()
    hook.before_train(t)
    with caplog.at_level("INFO", logger="libreyolo"):
        for epoch in range(4):
            t.epoch = epoch
            hook.before_epoch(t)
            hook.after_epoch(t)
    said = [r.getMessage() for r in caplog.records if "scaler" in r.getMessage()]
    assert said == ["epoch 1: float16 loss scaler skipped 5 steps for overflow (8 in all)",
                    "epoch 4: float16 loss scaler skipped 1 steps for overflow (9 in all)"]
    rows = (tmp_path / "results.csv").read_text().splitlines()
    assert [r.rsplit(",", 1)[1] for r in rows] == ["skipped_steps", "8", "8", "8", "9"]


def test_results_page_is_redrawn_within_its_cost_bound_and_always_at_the_end(tmp_path, monkeypatch):
    # A clock that moves only when told: each epoch takes 2.5 s, each drawing of the page 0.25 s,
    # so with the bound of 50 the page may be drawn again 12.5 s after the last (every 5th epoch).
    from libreyolo import plots
    from libreyolo.engine import hooks

    now = [0.0]
    drawn = []

    def draw(run_dir, task, details, meta):
        now[0] += 0.25
        drawn.append(meta["epoch"])

    monkeypatch.setattr(hooks.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(plots, "write_results_html", draw)
    t = SimpleNamespace(epoch=0, start_epoch=0, metrics={"map50_95": 0.1, "map50": 0.2}, validated_epoch=-1,
                        run_dir=tmp_path,
                        task=get_task("detect"), arch="yolo9-t", data_cfg=SimpleNamespace(name="shapes"),
                        cfg=SimpleNamespace(epochs=12, imgsz=64, batch=8), val_details=None,
                        epoch_losses=lambda: {"box": 1.0}, optimizer=SimpleNamespace(param_groups=[{"lr": 0.01}]),
                        precision=SimpleNamespace(skipped_steps=lambda: 0))
    hook = hooks.ResultsHook()
    hook.before_train(t)
    for epoch in range(12):
        t.epoch = t.validated_epoch = epoch
        hook.before_epoch(t)
        now[0] += 2.5
        hook.after_epoch(t)
    hook.after_train(t)
    assert drawn == ["1/12", "6/12", "11/12", "12/12"]
    assert hooks.PAGE_COST_BOUND == 50


@pytest.mark.parametrize("start_epoch, kept", [(0, []), (2, ["1", "2"])])
def test_results_csv_starts_fresh_or_keeps_the_resumed_epochs(tmp_path, start_epoch, kept):
    from libreyolo.engine.hooks import ResultsHook

    path = tmp_path / "results.csv"
    path.write_text("epoch,train/box\n1,3.0\n2,2.0\n3,1.0\n")  # epoch 3 ran after the checkpoint
    t = SimpleNamespace(start_epoch=start_epoch, run_dir=tmp_path, precision=SimpleNamespace(skipped_steps=lambda: 0))
    ResultsHook().before_train(t)
    rows = path.read_text().splitlines() if path.exists() else []
    assert [r.split(",")[0] for r in rows[1:]] == kept and (not kept or rows[0] == "epoch,train/box")


def test_throughput_keeps_three_significant_figures():
    from libreyolo.engine.hooks import _rate

    assert [_rate(x) for x in (0.4567, 5.123, 61.66, 353.2)] == ["0.457", "5.12", "61.7", "353"]
