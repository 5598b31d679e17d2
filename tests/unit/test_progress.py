"""ProgressHook: plain lines in a log at a bounded rate; the bar and the step read nothing back."""

import io
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from libreyolo import LibreYOLO
from libreyolo.engine import hooks as hooks_module
from libreyolo.engine import trainer as T
from libreyolo.engine.hooks import ProgressHook
from libreyolo.tasks import get_task


class FakeTrainer(SimpleNamespace):
    task = get_task("detect")

    def epoch_losses(self):
        return {"box": 1.25, "cls": 2.5}


def _run_epoch(hook, clock, steps=100, log_interval=10, step_s=1.0):
    """One epoch of `steps` steps on a stand-in trainer; a read-back every `log_interval` steps."""
    t = FakeTrainer(epoch=0, cfg=SimpleNamespace(epochs=3), steps_per_epoch=steps, batch_index=0,
                    last_log=None, metrics={})
    hook.before_epoch(t)
    for i in range(steps):
        clock[0] += step_s
        t.batch_index = i
        if (i + 1) % log_interval == 0 or i + 1 == steps:
            t.last_log = {"img_s": 80.0}  # a new dict: what the trainer's read-back does
        hook.after_step(t)
    t.metrics = {"map50_95": 0.25, "map50": 0.5}
    hook.after_epoch(t)


def _plain(step_s, steps=100, log_interval=10):
    out, clock = io.StringIO(), [0.0]
    _run_epoch(ProgressHook(out, clock=lambda: clock[0]), clock, steps, log_interval, step_s)
    text = out.getvalue()
    assert "\x1b[" not in text  # a log gets no escape codes
    return text.splitlines()


def test_a_log_gets_a_line_per_tenth_of_the_epoch_then_the_epoch_line():
    lines = _plain(step_s=1.0)  # a read-back every 10 s, a tenth of the epoch each
    assert len(lines) == 10
    assert lines[0] == "epoch 1/3  10/100 steps (10%)  box 1.25  cls 2.5  80 img/s  0:00:10 elapsed, ETA 0:01:30"
    assert lines[8].startswith("epoch 1/3  90/100 steps (90%)")
    assert lines[-1] == "epoch 1/3  box 1.25  cls 2.5  80 img/s  mAP50-95 0.2500 mAP50 0.5000  100.0s"


def test_never_more_than_a_line_per_5_s_and_at_least_one_a_minute():
    lines = _plain(step_s=0.05, log_interval=2)  # a read-back every 0.1 s: a 5 s epoch
    assert len(lines) == 1 and lines[0].startswith("epoch 1/3  box")
    lines = _plain(step_s=0.1, steps=1000, log_interval=10)  # 100 s epoch, a read-back per second
    assert [ln.split()[2] for ln in lines[:-1]] == [f"{n}/1000" for n in range(100, 1000, 100)]  # a tenth each
    lines = _plain(step_s=7.0, steps=100, log_interval=1)  # 700 s epoch: a minute first
    assert lines[0].split()[2] == "9/100" and len(lines) == 12  # 63 s, 126 s, ... and the epoch line


def test_the_bar_shows_steps_figures_and_time_left():
    out = io.StringIO()
    hook = ProgressHook(out)
    hook.console = Console(file=out, force_terminal=True, width=160)
    hook.live = True
    _run_epoch(hook, [0.0], steps=20, log_interval=5)
    text = out.getvalue()
    assert "epoch 1/3" in text and "20/20" in text and "80 img/s" in text and "box 1.25" in text
    assert "ETA" in text and "mAP50-95 0.2500" in text and "\x1b[" in text


SYNCING = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


def test_the_step_and_the_live_bar_read_nothing_back_between_read_backs(tmp_path, monkeypatch, one_thread):
    """CPU stand-in for tests/gpu's sync-free step test: from before_step to the end of the hooks'
    after_step, nothing reads a tensor back to the host except the trainer's loss read-back."""
    reads, inside = [], [False]
    for name in SYNCING:
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, _name=name, **kw):
            if inside[0]:
                reads.append(_name)
            return _original(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)

    def around(fn, value):
        def wrapped(*a, **kw):
            saved, inside[0] = inside[0], value
            try:
                return fn(*a, **kw)
            finally:
                inside[0] = saved
        return wrapped

    def live_bar():
        hook = ProgressHook(io.StringIO())
        hook.console = Console(file=io.StringIO(), force_terminal=True, width=160)
        hook.live = True
        return hook

    monkeypatch.setattr(T, "train_step", around(T.train_step, True))
    monkeypatch.setattr(T.LossMeter, "add", around(T.LossMeter.add, True))
    monkeypatch.setattr(T.Trainer, "_read_losses", around(T.Trainer._read_losses, False))  # the allowed sync
    monkeypatch.setattr(ProgressHook, "after_step", around(ProgressHook.after_step, True))
    monkeypatch.setattr(hooks_module, "ProgressHook", live_bar)  # what default_hooks() builds
    # optimizer=sgd: torch's CPU AdamW reads its step count with .item() (a CUDA run uses fused AdamW).
    result = LibreYOLO("yolo9-t").train(data="shapes", epochs=1, imgsz=64, batch=8, device="cpu", workers=0,
                                        amp=False, val=False, optimizer="sgd", log_interval=4,
                                        project=str(tmp_path))
    assert result.epochs_run == 1
    assert reads == [], sorted(set(reads))


@pytest.mark.parametrize("terminal", [False, True])
def test_after_train_closes_a_bar_left_open(terminal):
    hook = ProgressHook(io.StringIO())
    if terminal:
        hook.console = Console(file=io.StringIO(), force_terminal=True)
        hook.live = True
    t = FakeTrainer(epoch=0, cfg=SimpleNamespace(epochs=1), steps_per_epoch=4, batch_index=0, last_log=None,
                    metrics={})
    hook.before_epoch(t)
    hook.after_train(t)
    assert hook.progress is None
