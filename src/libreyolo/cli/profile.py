"""`libreyolo profile`: measure a window of real training or inference steps, then read the results.

`run` trains just long enough to fill the profiler's window; `infer` runs predict's steps on
images for one window (profiler/infer.py). `summary`, `phases`, `kernels` and `compare` read
profile.json files only (no torch, no model code): they answer instantly and work on a copy in
another folder. `summary` and `compare` take `--fail-if` gates for CI (profiler/gates.py).
"""

from __future__ import annotations

import json
import sys

import typer

from ..logs import setup_logging
from .common import EXTRA, PlainUsage, user_errors

profile_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                          context_settings={"help_option_names": ["-h", "--help"]},
                          help="Profile training or inference: which lever (workers, cuda_graph, amp, batch, "
                               "memory) will help, and what it would buy. run and infer record a window; "
                               "summary, phases, kernels, ops, what-if and compare read profile.json files "
                               "(copies too) without importing torch.")

DEFAULT_FAMILY, DEFAULT_SIZE = "yolo9", "s"
# Keys `profile run` sets itself, and what to do instead.
RESERVED = {
    "model": "choose the model with --weights (and --size)",
    "data": "give the dataset as the first argument: libreyolo profile run DATA [key=value ...]",
    "epochs": "profile run trains just enough epochs to fill the window; set profile_skip/profile_steps",
    "profile": "profile run always profiles",
    "resume": "profile run always starts fresh",
}
# `profile infer` takes these as options, not as key=value.
INFER_OPTIONS = {
    "model": "give the model as the first argument: libreyolo profile infer MODEL",
    "source": "give the images as --source PATH",
    "batch": "give it as --batch N",
    "imgsz": "give it as --imgsz S",
}


def resolve_weights(weights: str | None, size: str | None) -> str:
    """The model name to train: --weights by the model-name rules, --size where it applies."""
    from ..errors import ConfigError
    from ..families import REGISTRY, arch_name, parse_family, parse_size

    spec = REGISTRY[DEFAULT_FAMILY] if weights is None else parse_family(weights)
    if spec is not None:  # absent, or a family name: --size picks the size
        wanted = parse_size(spec, size or (DEFAULT_SIZE if DEFAULT_SIZE in spec.sizes else spec.sizes[0]))
        if wanted is None:
            raise ConfigError(f"unknown size '{size}' for {spec.display} (allowed: {', '.join(spec.sizes)})")
        return arch_name(spec, wanted)
    if size is None:
        return weights
    from ..resolve import resolve_model

    source = resolve_model(weights)
    if parse_size(source.spec, size) != source.size:
        raise ConfigError(f"--size {size} contradicts '{weights}', which is {source.arch}; drop --size or "
                          f"choose other weights")
    return weights


@profile_app.command(cls=PlainUsage, context_settings=EXTRA)
@user_errors
def run(ctx: typer.Context,
        data: str = typer.Argument(..., metavar="DATA", help="Dataset: built-in name (shapes, coco128, shapes-cls, shapes-seg), a dataset yaml, a class-folder dataset for a classifier, or an images/ + masks/ folder for a segmenter."),
        weights: str | None = typer.Option(None, "--weights", help="Model: architecture, family, official "
                                                                    "weights name or checkpoint (default yolo9)."),
        size: str | None = typer.Option(None, "--size", help="Size when --weights is a family or absent (default s)."),
        repeat: int = typer.Option(1, "--repeat", min=1, help="Trials, each in its own process; reports mean ± std."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary (or the repeat aggregate) as JSON.")) -> None:
    """Profile training: libreyolo profile run DATA [--weights W] [--size S] [--repeat N] [key=value ...]

    Trains just enough steps to fill the window (profile_skip skipped, profile_steps // 2 timed,
    profile_steps recorded, and on CUDA 2 op steps for the host operators) with
    no_aug_epochs=0 and val=false, into runs/profile/prof (prof2, ... like train runs), and prints
    the report: verdict, the lever to pull, phases and top kernels. Any train key may follow as
    key=value. Files: profile.json, profile_summary.json, profile_trace.json (Perfetto, HTA),
    timeline.html.
    """
    from ..config import FIELDS
    from ..errors import ConfigError
    from .grammar import parse_overrides
    from .precheck import check_data, check_model

    setup_logging()
    if "=" in data and data.split("=", 1)[0] in FIELDS:
        raise ConfigError(f"'{data}' is a key=value, not a dataset: libreyolo profile run DATA [key=value ...]")
    overrides = parse_overrides(ctx.args)
    for key, instead in RESERVED.items():
        if key in overrides:
            raise ConfigError(f"'{key}' cannot be set for profile run: {instead}")
    check_model(weights)  # before resolve_weights imports torch: a missing file answers instantly
    check_data(data)
    model = resolve_weights(weights, size)
    from ..profile_run import run_once, run_trials

    if repeat == 1:
        _show_profile(run_once(model, data, overrides), as_json)
    else:
        _show_trials(*run_trials(model, data, overrides, repeat), as_json)


@profile_app.command(cls=PlainUsage, context_settings=EXTRA)
@user_errors
def infer(ctx: typer.Context,
          model: str = typer.Argument(..., metavar="MODEL", help="Model: architecture (yolo9-t), official weights "
                                                                 "name or checkpoint."),
          batch: int = typer.Option(1, "--batch", help="Images per forward (default 1: the latency case)."),
          imgsz: int | None = typer.Option(None, "--imgsz", help="Network input size, a multiple of 32 (default: the "
                                                                 "checkpoint's training size, else the family's)."),
          source: str | None = typer.Option(None, "--source", help="Images: a file, a folder or a glob (default: "
                                                                   "the built-in validation images of the model's "
                                                                   "task: shapes, shapes-cls or shapes-seg)."),
          repeat: int = typer.Option(1, "--repeat", min=1, help="Trials, each in its own process; reports mean ± std."),
          as_json: bool = typer.Option(False, "--json", help="Print the summary (or the repeat aggregate) as JSON.")
          ) -> None:
    """Profile inference: libreyolo profile infer MODEL [--batch N] [--imgsz S] [--source PATH] [--repeat N] [key=value ...]

    Runs predict's own steps over the images, cycling, for one profiler window (profile_skip skipped,
    profile_steps // 2 timed, profile_steps recorded, on CUDA 2 op steps), into runs/profile/infer (infer2, ...), and prints the same report as profile
    run: verdict, the lever to pull (batch, cuda_graph, amp, workers), phases and top kernels.
    Phases: data (decode, then letterbox or crop: the wait for a prepared batch), h2d, forward,
    postprocess (NMS and the copy of the results to the host). Keys: device, amp, amp_dtype,
    cuda_graph (needs profile_skip >= 1), workers (decode and prepare threads, default 4; 0: on
    the loop's thread), conf, iou, max_det, profile_skip, profile_steps, project, name, exist_ok. Files:
    profile.json, profile_summary.json, profile_trace.json (Perfetto, HTA), timeline.html, args.yaml.
    """
    from ..config import FIELDS
    from ..errors import ConfigError
    from .grammar import parse_overrides, split_pairs
    from .precheck import check_model, check_source

    setup_logging()
    if "=" in model and model.split("=", 1)[0] in FIELDS:
        raise ConfigError(f"'{model}' is a key=value, not a model: libreyolo profile infer MODEL [key=value ...]")
    for key, _ in split_pairs(ctx.args):
        if key in INFER_OPTIONS:
            raise ConfigError(f"'{key}' is not a key=value of profile infer: {INFER_OPTIONS[key]}")
    check_model(model)  # before torch is imported: a missing file answers instantly
    check_source(source)
    from ..profile_run import run_trials
    from ..profiler.infer import KEYS
    from ..profiler.infer import run_once as infer_once

    overrides = parse_overrides(ctx.args, allowed=set(KEYS) - set(INFER_OPTIONS))
    overrides.update({"batch": batch, **({"imgsz": imgsz} if imgsz is not None else {}),
                      **({"source": source} if source is not None else {})})
    if repeat == 1:
        _show_profile(infer_once(model, overrides), as_json)
    else:
        _show_trials(*run_trials(model, None, overrides, repeat, mode="infer"), as_json)


def _show_profile(run_dir, as_json: bool) -> None:
    """One profile's report, or its summary as JSON, on stdout."""
    from ..profiler.artifacts import load_profile, summary
    from ..profiler.report import print_report

    profile = load_profile(run_dir)
    if as_json:
        typer.echo(json.dumps({"run_dir": str(run_dir), **summary(profile)}, indent=1))
    else:
        print_report(profile, file=sys.stdout, read_from=run_dir)


def _show_trials(parent, rep: dict, as_json: bool) -> None:
    """A --repeat run's aggregate on stdout."""
    from ..profiler.report import print_repeat

    if as_json:
        typer.echo(json.dumps({"run_dir": str(parent), **rep}, indent=1))
    else:
        print_repeat(rep, file=sys.stdout)
        typer.echo(f"trials in {parent}; aggregate in {parent / 'profile_repeat.json'}")


FAIL_IF_HELP = ("A CI gate, repeatable: FIELD OP VALUE (a key of profile_summary.json; OP < <= > >= == !=), e.g. "
                "\"utilisation<0.7\" or \"verdict==dataloader-bound\"; exit code 1 when it holds.")


@profile_app.command("summary", cls=PlainUsage)
@user_errors
def summary_cmd(path: str = typer.Argument(..., metavar="PATH", help="profile.json or the run directory holding it; "
                                                                   "or a --repeat run's directory or profile_repeat.json."),
                as_json: bool = typer.Option(False, "--json", help="The headline figures as JSON "
                                                                   "(same keys as profile_summary.json)."),
                fail_if: list[str] | None = typer.Option(None, "--fail-if", metavar="EXPR", help=FAIL_IF_HELP)) -> None:
    """Headline figures and the verdict of a profile, or of a --repeat run (its directory or its
    profile_repeat.json): mean ± std of each figure over the trials, and each trial's verdict.
    --fail-if gates a --repeat run on the trials' means and the verdict most trials gave."""
    from ..profiler.artifacts import load_for_summary, profile_path, summary
    from ..profiler.gates import failure, parse_all, repeat_figures
    from ..profiler.report import print_repeat, print_report

    gates = parse_all(fail_if)  # a malformed gate answers before any file is read
    kind, data = load_for_summary(path)
    if kind == "repeat" and as_json:
        typer.echo(json.dumps(data, indent=1))
    elif kind == "repeat":
        print_repeat(data, file=sys.stdout)
    elif as_json:
        typer.echo(json.dumps(summary(data), indent=1))
    else:
        print_report(data, file=sys.stdout, sections=("headline", "verdict"), read_from=profile_path(path).parent)
    if kind == "repeat":
        figures, notes = repeat_figures(data)
        _gate(failure(gates, figures, name="the --repeat aggregate", notes=notes))
    else:
        _gate(failure(gates, summary(data)))


@profile_app.command("compare", cls=PlainUsage)
@user_errors
def compare_cmd(a: str = typer.Argument(..., metavar="A", help="The baseline: profile.json or the run directory "
                                                              "holding it."),
                b: str = typer.Argument(..., metavar="B", help="The profile to compare with A (same form)."),
                as_json: bool = typer.Option(False, "--json", help="The comparison as one JSON object."),
                force: bool = typer.Option(False, "--force", help="Compare profiles of different batch or imgsz "
                                                                  "(the output says they differ)."),
                top: int = typer.Option(10, "--top", min=1, help="Kernels from each profile's top N."),
                fail_if: list[str] | None = typer.Option(None, "--fail-if", metavar="EXPR",
                                                         help=FAIL_IF_HELP + " FIELD is B's figure; VALUE may be "
                                                              "A (A's figure) or N*A, e.g. \"step_ms>1.05*A\".")
                ) -> None:
    """Two profiles side by side: headline figures, phases and top kernels with their deltas, and
    one line on the change (B faster, slower or unchanged within 5 %, and whether from idle time,
    kernel time or data wait). A and B must be of one schema version and mode (training or
    inference) and, without --force, of one batch and imgsz."""
    from ..profiler.compare import compare
    from ..profiler.gates import failure, parse_all
    from ..profiler.report import print_compare

    gates = parse_all(fail_if, compare=True)  # a malformed gate answers before any file is read
    result = compare(_one_profile(a), _one_profile(b), force=force, top=top, paths=(a, b))
    if as_json:
        typer.echo(json.dumps(result, indent=1))
    else:
        print_compare(result, file=sys.stdout, top=top)
    _gate(failure(gates, result["b"], result["a"], name="B"))


def _one_profile(path: str) -> dict:
    """A profile for compare: a --repeat aggregate is refused with its first trial named."""
    from ..errors import ProfileFormatError
    from ..profiler.artifacts import load_for_summary

    kind, data = load_for_summary(path)
    if kind == "repeat":
        trial = next(iter(data.get("dirs") or []), "prof_1")
        raise ProfileFormatError(f"'{path}' is the aggregate of a --repeat run: compare reads one profile per "
                                 f"side; give one trial ({trial})")
    return data


def _gate(failed: str | None) -> None:
    """Exit code 1 with the failed gate's line on stderr, after the command's normal output."""
    if failed:
        typer.echo(failed, err=True)
        raise typer.Exit(1)


@profile_app.command(cls=PlainUsage)
@user_errors
def phases(path: str = typer.Argument(..., metavar="PATH", help="profile.json, or the run directory holding it."),
           as_json: bool = typer.Option(False, "--json", help="The phase rows as JSON.")) -> None:
    """Mean time per step of each phase: host time unsynchronised, and synchronised CPU/GPU time."""
    from ..profiler.artifacts import load_profile, phase_rows
    from ..profiler.report import print_report

    profile = load_profile(path)
    if as_json:
        typer.echo(json.dumps(phase_rows(profile), indent=1))
    else:
        print_report(profile, file=sys.stdout, sections=("phases",))


@profile_app.command(cls=PlainUsage)
@user_errors
def kernels(path: str = typer.Argument(..., metavar="PATH", help="profile.json, or the run directory holding it."),
            top: int = typer.Option(10, "--top", min=1, help="How many rows."),
            as_json: bool = typer.Option(False, "--json", help="The kernel rows as JSON.")) -> None:
    """The kernels (CPU runs: top-level ops) that took the most time in the window."""
    from ..profiler.artifacts import kernel_rows, load_profile
    from ..profiler.report import print_report

    profile = load_profile(path)
    if as_json:
        typer.echo(json.dumps(kernel_rows(profile, top), indent=1))
    else:
        print_report(profile, file=sys.stdout, sections=("kernels",), top=top)


@profile_app.command("what-if", cls=PlainUsage)
@user_errors
def what_if_cmd(path: str = typer.Argument(..., metavar="PROFILE", help="profile.json, or the run directory holding "
                                                                      "it (best an eager window: a run on one GPU is graphed by default, so "
                                                                      "profile it with cuda_graph=false)."),
                as_json: bool = typer.Option(False, "--json", help="The predictions as one JSON object.")) -> None:
    """What each lever would make of the profiled step, predicted from this one window: cuda_graph=true
    (the captured region's host time removed, the rest of the step's host time and every kernel
    kept), cuda_graph=full (the whole step's host time but the data wait and upload removed), full
    with compile=true (a floor: only the convolution and GEMM kernels keep their time), amp=true with float16 and with bfloat16 (when the window ran float32: kernel busy
    times the float16/float32 ratio bench step measured on the H200), both together, and a
    dataloader that never makes the step wait. Each prediction prints the assumption it rests on."""
    from ..profiler.artifacts import load_profile
    from ..profiler.report import print_whatif
    from ..profiler.whatif import what_if

    result = what_if(load_profile(path), path=path)
    if as_json:
        typer.echo(json.dumps(result, indent=1))
    else:
        print_whatif(result, file=sys.stdout)


@profile_app.command(cls=PlainUsage)
@user_errors
def ops(path: str = typer.Argument(..., metavar="PROFILE", help="profile.json, or the run directory holding it."),
        top: int = typer.Option(10, "--top", min=1, help="How many operators."),
        as_json: bool = typer.Option(False, "--json", help="The table as one JSON object.")) -> None:
    """The host-side operators that cost the most CPU time per step, by self time (the operator's
    own Python, dispatch and launch cost): what a launch-bound eager step spends its host time on.
    On CUDA they come from op steps recorded after the window with CPU activity only (so the
    window's own figures stay unbent); on a CPU, from the recorded steps."""
    from ..profiler.artifacts import host_op_table, load_profile
    from ..profiler.report import print_ops

    table = host_op_table(load_profile(path), top, path=path)
    if as_json:
        typer.echo(json.dumps(table, indent=1))
    else:
        print_ops(table, file=sys.stdout, top=top)
