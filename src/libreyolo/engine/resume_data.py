"""A resume's dataset: the one its checkpoint trained on, or the same one moved to a new place.

A checkpoint's config names the dataset it trained on (`data`); a resume trains on with it. A
dataset that moved since (another disk, another machine) is given again with `data=` beside
`resume=`: it is honoured when it is the same dataset, which is checked, not assumed: the same
class names in the same order, and the same numbers of usable train and val images as the
checkpoint recorded (`data_images`, engine/state.py). Anything else is refused in one line
saying which differs. A resume without `data=` whose dataset is gone says that `data=` is how to
point it at the new place.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..errors import DataError

log = logging.getLogger("libreyolo")


def moved_data(user: dict[str, Any], ckpt: dict[str, Any]) -> str | None:
    """The user's `data=` when it names another place than the checkpoint's dataset, else None."""
    given = user.get("data")
    if given in (None, ""):
        return None
    trained = ckpt["config"].get("data")
    return None if str(given) == str(trained) else str(given)


def load_resume_data(task, data: str, moved: bool, path: Path):
    """The task's data config for `data`; a resume whose own dataset is gone gets the hint."""
    try:
        return task.load_data(data)
    except DataError as exc:
        if moved:
            raise
        raise DataError(f"{exc} (the dataset {path} trained on; if it moved, resume with data=<its new "
                        f"place> beside resume=)") from None


def check_names(ckpt: dict[str, Any], data_cfg, data: str, path: Path) -> None:
    """Before anything is built: a moved dataset has the checkpoint's class names, in order."""
    trained = [str(n) for n in ckpt["names"]]
    names = [str(n) for n in data_cfg.names]
    if names == trained:
        return
    if len(names) != len(trained):
        why = f"it has {len(names)} classes, the checkpoint {len(trained)}"
    elif sorted(names) == sorted(trained):
        why = "its class names are in another order"
    else:
        i = next(i for i, (a, b) in enumerate(zip(names, trained)) if a != b)
        why = f"class {i} is '{names[i]}' there but '{trained[i]}' in the checkpoint"
    raise DataError(f"cannot resume '{path}' on data={data}: not the dataset it trained on "
                    f"({ckpt['config'].get('data')}): {why}")


def image_counts(trainer) -> dict[str, int | None]:
    """The usable images of each split the run trains and validates on (what a checkpoint keeps)."""
    val = trainer.val_loader
    return {"train": int(trainer.train_loader.num_images), "val": int(val.num_images) if val is not None else None}


def check_counts(ckpt: dict[str, Any], trainer, data: str, path: Path) -> None:
    """After the dataset was scanned: the same numbers of usable images as the checkpoint's run
    (a checkpoint from before they were kept: only the names were compared, and said so)."""
    trained = ckpt.get("data_images")
    old = ckpt["config"].get("data")
    if not isinstance(trained, dict):
        log.info(f"resuming on data={data} in place of {old}: the same {len(ckpt['names'])} class names (this "
                 f"checkpoint does not record its image counts, so only the names were compared)")
        return
    now = image_counts(trainer)
    for split in ("train", "val"):
        if trained.get(split) is not None and now[split] is not None and trained[split] != now[split]:
            raise DataError(f"cannot resume '{path}' on data={data}: not the dataset it trained on ({old}): "
                            f"{now[split]} usable {split} images there, {trained[split]} when it trained")
    log.info(f"resuming on data={data} in place of {old}: the same dataset moved ({len(ckpt['names'])} class "
             f"names, {now['train']} train" + (f" and {now['val']} val" if now["val"] is not None else "")
             + " images)")
