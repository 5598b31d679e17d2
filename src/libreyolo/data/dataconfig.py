"""`DataConfig`: a resolved detection dataset, whichever form its labels came in (YOLO txt files
or COCO json). Its own module, so the readers of both forms (dataset_yaml.py, coco_json.py) build
it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class DataConfig:
    """A resolved dataset: image files of each split, class names, where it came from."""

    name: str
    yaml_path: Path
    root: Path
    train: list[Path]
    val: list[Path]
    names: list[str]
    extra: dict[str, Any] = field(default_factory=dict)  # other yaml keys, untouched
    # A COCO-json dataset (coco_json.py): class k's category id, and each split's annotations.
    category_ids: list[int] | None = None
    annotations: dict[str, Any] = field(default_factory=dict)

    @property
    def nc(self) -> int:
        return len(self.names)
