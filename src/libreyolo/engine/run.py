"""The seam between the training loop and what runs around it: the hook contract, and the run a hook sees.

Call sequence (the trainer calls every hook in list order):

    before_train
    for each epoch:   before_epoch
        for each step:    before_step, <step>, after_step
                      after_epoch
    after_train

`before_step` and `after_step` run every step: keep them cheap (no host sync; the trainer reads
the loss back once per log interval and exposes it as `last_log`). A hook may remove itself with
`remove_hook(self)`.

`Run` is the part of the trainer (trainer.py) that its hooks (hooks.py, the profiler's window) and
its checkpoints (state.py) read and call: nothing else of the loop. They import this module, and
the trainer imports them, so neither side has to import the other to know what it is handed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer

    from ..config import TrainConfig
    from ..families.base import FamilySpec
    from ..tasks.base import TaskSpec
    from .distributed import World
    from .ema import ModelEMA
    from .meter import LossMeter
    from .precision import Precision


class Hook:
    def before_train(self, trainer: Run) -> None: ...
    def before_epoch(self, trainer: Run) -> None: ...
    def before_step(self, trainer: Run) -> None: ...
    def after_step(self, trainer: Run) -> None: ...
    def after_epoch(self, trainer: Run) -> None: ...
    def after_train(self, trainer: Run) -> None: ...
    def state_dict(self) -> dict: return {}
    def load_state_dict(self, state: dict) -> None: ...


class Run(Protocol):
    """A training run as its hooks and its checkpoint see it (engine/trainer.py's Trainer)."""

    # What is trained, on what, where.
    cfg: TrainConfig
    family: FamilySpec
    size: str
    task: TaskSpec
    data_cfg: Any            # the task's dataset: .name, .names
    run_dir: Path
    world: World             # this process's place under multi-process training
    # What a step updates.
    model: nn.Module
    ema: ModelEMA | None
    optimizer: Optimizer
    precision: Precision
    # Where the loop is.
    start_epoch: int         # the first epoch of this process (a resume's next one)
    epoch: int
    batch_index: int
    iteration: int
    steps_per_epoch: int
    updates: int             # optimizer steps of the run so far
    checkpoint_step: int | None  # batches of the epoch done, during the step a mid-epoch checkpoint is due
    meter: LossMeter         # the epoch's loss sums (a mid-epoch checkpoint keeps them)
    stop: bool               # a hook sets it to end the run after this step or epoch
    # The last validation: scalar metrics, the task's detail results, and its epoch.
    metrics: dict[str, float]
    val_details: dict[str, Any] | None
    validated_epoch: int
    hooks: list[Hook]
    rank_rng: list | None    # every rank's RNG state at the epoch end (rank 0, multi-process)

    @property
    def arch(self) -> str: ...

    @property
    def last_log(self) -> dict[str, float] | None:
        """img/s and GPU memory of the last loss read-back."""

    def epoch_losses(self) -> dict[str, float]:
        """Mean loss items over this epoch's steps read back so far."""

    def validate(self) -> dict[str, float]:
        """Evaluate with the task's evaluator; sets `metrics`, `val_details`, `validated_epoch`."""

    def save_in_background(self, *paths: Path) -> None:
        """The training state written to each of `paths` on the checkpoint thread."""

    def remove_hook(self, hook: Hook) -> None: ...
