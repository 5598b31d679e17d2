"""The loss meter's read-back, synchronous and deferred (the CUDA path's logic, run on the CPU)."""

import math

import pytest
import torch

from libreyolo.engine.meter import LossMeter, NonFiniteLossError

CPU = torch.device("cpu")


def _feed(meter, values):
    """A step per value; its items are value, 2 x value, ... (one per item name)."""
    for v in values:
        meter.add(torch.tensor([v * (k + 1) for k in range(len(meter.item_names))]), images=4)


def _never():
    raise AssertionError("last_good is asked only on a failure")


@pytest.mark.parametrize("deferred", [False, True])
def test_epoch_means_equal_whichever_read(deferred):
    meter = LossMeter(("box", "cls"), CPU, deferred=deferred)
    assert meter.deferred is deferred
    _feed(meter, [1.0, 2.0, 3.0])
    meter.read(True, "epoch 1, step 3", _never)
    # Deferred: the interval's sums are on their way, not counted yet, and nothing is shown.
    assert meter.epoch_means() == ({"box": 0.0, "cls": 0.0} if deferred else {"box": 2.0, "cls": 4.0})
    assert (meter.last_log is None) is deferred
    _feed(meter, [5.0])
    meter.read(True, "epoch 1, step 4", _never)  # settles the previous interval when deferred
    assert meter.epoch_means() == ({"box": 2.0, "cls": 4.0} if deferred else {"box": 2.75, "cls": 5.5})
    _feed(meter, [7.0, 9.0])
    meter.read(True, "epoch 1, step 6", _never, final=True)  # the epoch's end: everything is read
    assert meter.epoch_means() == {"box": 27 / 6, "cls": 54 / 6}
    assert meter.interval_steps == 0 and meter.last_log["img_s"] > 0


def test_deferred_buffers_are_not_overwritten_before_they_are_read():
    """Interval k's copy sits in one host buffer while interval k+1 fills the other."""
    meter = LossMeter(("box",), CPU, deferred=True)
    for i in range(1, 6):
        meter.add(torch.tensor([float(i)]), images=1)
        meter.read(True, f"epoch 1, step {i}", _never)
    meter.read(True, "epoch 1, step 5", _never, final=True)  # an empty interval settles the pending one
    assert meter.epoch_means() == {"box": 3.0} and meter._pending is None


def test_a_final_read_with_nothing_pending_or_new_is_a_no_op():
    meter = LossMeter(("box",), CPU, deferred=True)
    meter.read(False, "epoch 1, step 0", _never, final=True)
    assert meter.last_log is None and meter.epoch_means() == {"box": 0.0}


@pytest.mark.parametrize("deferred", [False, True])
def test_non_finite_without_a_scaler_names_its_own_interval(deferred):
    meter = LossMeter(("box",), CPU, deferred=deferred)
    _feed(meter, [1.0, 1.0])
    meter.read(False, "epoch 2, step 2", _never)
    _feed(meter, [math.nan, 1.0])
    if deferred:  # caught at the next read, but named by the interval it happened in
        meter.read(False, "epoch 2, step 4", _never)
        _feed(meter, [1.0])
    with pytest.raises(NonFiniteLossError) as err:
        meter.read(False, "epoch 2, step 5" if deferred else "epoch 2, step 4", lambda: "resume from last.pt",
                   final=True)
    assert str(err.value).startswith("non-finite loss at epoch 2, step 4 (1 of the last 2 steps)")
    assert str(err.value).endswith("resume from last.pt")


def test_a_failed_read_leaves_nothing_pending_for_a_later_epoch():
    """A non-finite interval raised while the next one was already on its way: that one is
    dropped with the failed epoch, and a new epoch counts only its own steps."""
    meter = LossMeter(("box",), CPU, deferred=True)
    _feed(meter, [math.nan])
    meter.read(False, "epoch 1, step 1", _never)
    _feed(meter, [2.0])
    with pytest.raises(NonFiniteLossError):
        meter.read(False, "epoch 1, step 2", lambda: "")
    meter.start_epoch()
    _feed(meter, [1.0])
    meter.read(False, "epoch 2, step 1", _never, final=True)
    assert meter.epoch_means() == {"box": 1.0}


def test_with_a_scaler_skipped_steps_are_left_out_of_the_mean():
    meter = LossMeter(("box",), CPU, deferred=True)
    _feed(meter, [2.0, math.inf, 4.0])
    meter.read(True, "epoch 1, step 3", _never, final=True)
    assert meter.epoch_means() == {"box": 3.0}


def test_cuda_devices_defer_and_cpu_reads_at_once():
    assert LossMeter(("box",), CPU).deferred is False
    if torch.cuda.is_available():
        assert LossMeter(("box",), torch.device("cuda")).deferred is True
