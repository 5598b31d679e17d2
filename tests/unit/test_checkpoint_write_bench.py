"""benchmarks/checkpoint_write.py's two copies: the baseline a storage per tensor, ours a few."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import checkpoint_write  # noqa: E402

from libreyolo.engine.state import _copied  # noqa: E402
from libreyolo.errors import WriteError  # noqa: E402


def test_the_baseline_copies_a_storage_per_tensor_and_ours_one_per_dtype(tmp_path):
    state = checkpoint_write.state_of("yolo9-t")
    assert set(state) == {"model", "ema", "optimizer"} and state["optimizer"]["state"]  # the moments exist
    for copy in (checkpoint_write.per_tensor, _copied):
        payload = {part: copy(value) for part, value in state.items()}
        for part, value in payload.items():
            leaves = list(checkpoint_write._leaves(value))
            storages = len({t.untyped_storage().data_ptr() for t in leaves})
            dtypes = len({t.dtype for t in leaves})
            assert storages == (len(leaves) if copy is checkpoint_write.per_tensor else dtypes), (part, storages)
        path = tmp_path / f"{copy.__name__}.pt"
        checkpoint_write.timed_write(path, payload, busy=True)  # raises what the thread raised
        back = torch.load(path, weights_only=True)
        assert all(torch.equal(back["model"][k], v) for k, v in state["model"].items())


def test_a_failed_write_is_raised_not_spun_on(tmp_path):
    (tmp_path / "weights").write_text("a file where the folder should be")
    with pytest.raises((OSError, WriteError)):  # the folder cannot be made: an OSError
        checkpoint_write.timed_write(tmp_path / "weights" / "last.pt", {"model": {}}, busy=True)
