"""What the command line can check before it imports torch: the files its arguments name.

Importing torch (and the model code) takes seconds: 2-4 s on an idle machine, 7-11 s on a busy
one. A mistyped path should not wait for it. These checks raise the very one-line errors the full
checks would raise later (tests/unit/test_cli_precheck.py holds them to it), and only for inputs
that are wrong whatever torch would say; what needs torch to decide (a checkpoint's contents, an
official weights name that may still be downloaded) is left to the full checks.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, DataError, ModelNameError
from ..names import is_missing_weights


def check_model(name: Any) -> None:
    """A `model=` that names a weights file which does not exist (and cannot be downloaded)."""
    if isinstance(name, str) and name.strip() and is_missing_weights(name):
        raise ModelNameError(f"weights file '{name}' does not exist")


def check_resume(resume: Any) -> None:
    """A `resume=path` whose checkpoint does not exist."""
    if not isinstance(resume, str) or resume.lower() in ("", "true", "false"):
        return
    path = Path(resume)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist")


def check_data(data: Any) -> None:
    """A `data=` that is neither a built-in dataset, an existing yaml file nor a folder (a
    classification dataset, checked by its loader)."""
    if not isinstance(data, str) or not data:
        return
    if Path(data).expanduser().is_dir():
        return  # a classification folder (train/<class>/, val/<class>/): the task's loader checks it
    if _is_builtin_name(data):
        if not _packaged().joinpath(f"{data}.yaml").is_file():
            known = ", ".join(sorted(p.name[: -len(".yaml")] for p in _packaged().iterdir()
                                     if p.name.endswith(".yaml")))
            raise DataError(f"unknown dataset '{data}': built-in datasets are {known} "
                            f"(or pass a path to a dataset .yaml)")
        return
    path = Path(data).expanduser()
    if not path.is_file():
        what = "annotations" if data.lower().endswith(".json") else "dataset yaml"
        raise DataError(f"{what} not found: {path}")


def check_source(source: Any) -> None:
    """A predict `source=` path that does not exist (a glob pattern is left to the full check)."""
    if isinstance(source, str) and source and not any(c in source for c in "*?[") and "://" not in source \
            and not Path(source).expanduser().exists():
        raise DataError(f"source '{source}' does not exist")


def check_inputs(args: dict[str, Any], model: Any = None) -> None:
    """The checks above, in the order the full checks run them: the model, a resumed checkpoint,
    then the dataset."""
    check_model(model if model is not None else args.get("model"))
    check_resume(args.get("resume"))
    check_data(args.get("data"))


# The same rule as data/dataset_yaml.py (importing that module would import the data pipeline,
# torch included): a name without a slash or a yaml suffix means a packaged dataset.
def _is_builtin_name(text: str) -> bool:
    return "/" not in text and "\\" not in text and not text.lower().endswith((".yaml", ".yml", ".json"))


def _packaged():
    return resources.files("libreyolo").joinpath("configs").joinpath("datasets")
