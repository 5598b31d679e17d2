"""Generated documentation: docs/hyperparameters.md comes from TrainConfig (`libreyolo cfg --markdown`);
the CUDA-graph support matrix in docs/training-performance.md comes from the family specs."""

from __future__ import annotations

from .config import config_table

GROUPS = {"model": "What to train", "train": "Loop", "data": "Data", "optim": "Optimisation",
          "augment": "Augmentation", "speed": "Speed levers", "multi": "Multi-GPU training",
          "val": "Validation", "output": "Output"}

PRECISION = """\
## Precision

Resolved once per run from `amp`, `amp_dtype` and the device; the run log states the outcome once
(`precision: bfloat16 autocast, scaler off`).

| amp | amp_dtype | device | autocast | loss scaler | log line |
|---|---|---|---|---|---|
| false | any | any | none (float32) | off | - |
| true | float16 | CUDA | float16 | on (dynamic) | - |
| true | bfloat16 | CUDA with native bf16 (compute capability >= 8) | bfloat16 | off | - |
| true | bfloat16 | CUDA without native bf16 | float16 | on (dynamic) | says it fell back |
| true | any | CPU | none (float32) | off | says amp needs CUDA |

- The loss is computed in float32 whatever the autocast dtype (the criterion runs outside
  autocast and casts the network outputs).
- float16: a live `GradScaler` scales the loss; a step whose gradients overflow is skipped, and
  the count of skipped steps is reported at each epoch end and in `results.csv`.
- float32/bfloat16 have no scaler to absorb a non-finite loss: the run stops with one line naming
  the epoch, the step and the last loss items. The loss is read back once per `log_interval`
  steps, so detection happens at that read (on CUDA one interval later, since the read within an
  epoch is deferred so the loop does not wait for the device; the message names the interval the
  loss went bad in); `last.pt` is only ever written from a finite state at an epoch end, so it
  is the last good state.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a bare pipe would split the markdown table cell


def hyperparameters_markdown() -> str:
    lines = ["# Hyperparameters", "",
             "Generated from `libreyolo.config.TrainConfig` by `libreyolo cfg --markdown`; do not edit by hand.",
             "Set any key as `key=value` on the command line or as a keyword of `LibreYOLO(...).train()`.",
             "A model's family and size defaults override these base defaults (see the last section); "
             "your values override both.", ""]
    rows = config_table()
    for group, title in GROUPS.items():
        lines += [f"## {title}", "", "| key | default | type | meaning |", "|---|---|---|---|"]
        lines += [f"| `{r['key']}` | `{r['default']}` | {_cell(r['type'])} | {r['doc']} |" for r in rows if r["group"] == group]
        lines.append("")
    return "\n".join(lines) + "\n" + PRECISION + "\n" + model_defaults_markdown()


def model_defaults_markdown() -> str:
    """Per family, the keys its published recipe sets, then the keys a size's recipe changes."""
    from .config import show_value
    from .families import REGISTRY

    def keys(values: dict) -> str:
        return ", ".join(f"`{k}={show_value(v)}`" for k, v in values.items())

    rows = ["## Model defaults", "",
            "Where a family's published recipe differs from the base defaults, and where one of its sizes",
            "differs again (the family comment in `families/<name>/spec.py` cites the recipe).",
            "`libreyolo cfg model=NAME` prints every value one model trains with and where it comes from.",
            "", "| family | sizes | defaults |", "|---|---|---|"]
    for spec in REGISTRY.values():
        own = keys(spec.defaults) or "-"
        if spec.inherits:  # by inheritance, not by copy: the parent's row holds those values
            own = f"{REGISTRY[spec.inherits].display}'s, then {own}" if spec.defaults else f"{REGISTRY[spec.inherits].display}'s"
        rows.append(f"| {spec.display} | all | {own} |")
        rows += [f"| {spec.display} | {size} | {keys(values)} |" for size, values in spec.size_defaults.items()]
    return "\n".join(rows) + "\n"


def capture_support_markdown() -> str:
    """The CUDA-graph support matrix: family x task -> captured region, or eager and why."""
    from .families import REGISTRY

    # Multi-GPU (DDP) runs train eager in every family (engine/graphs.py, MULTI_PROCESS).
    # Inference (predict cuda_graph=true) captures model.predict whole, where training captures
    # anything at all: there is no backward, loss or optimizer to keep out (predict/graph.py).
    # cuda_graph=full captures the whole step where the family's plan has no `whole` reason, and
    # trains as `true` (saying the reason) where it has one (engine/fullstep.py).
    # compile=true compiles the network where it is the captured region (engine/builder.py).
    rows = ["| family | task | training: `cuda_graph=true` region | `cuda_graph=full` | `compile=true` | multi-GPU (DDP) "
            "| inference (`predict`) | note (`true`) |",
            "|---|---|---|---|---|---|---|---|"]
    for spec in REGISTRY.values():
        plan = spec.capture
        region = plan.region if plan.region in ("network", "encoder") else "eager"
        note = plan.note if region != "eager" else plan.reason
        infer = "network + decode" if region != "eager" else "eager"
        whole = "eager" if region == "eager" else f"as `true`: {plan.whole}" if plan.whole else "whole step"
        compiled = "the network" if region == "network" else "uncompiled: its region is not the whole network" \
            if region == "encoder" else "eager"
        for task in spec.tasks:
            rows.append(f"| {spec.display} | {task} | {region} | {_cell(whole)} | {compiled} | eager | {infer} "
                        f"| {_cell(note)} |")
    return "\n".join(rows) + "\n"
