"""`libreyolo` command line: train, val, predict, export, cfg, data, and the bench and profile groups.

User mistakes print one line (`error: ...`) on stderr and exit 2, without a traceback
(common.py's `user_errors`); `LIBREYOLO_DEBUG=1` re-raises so the traceback shows.
"""

from __future__ import annotations

import json
import os
import sys

import typer

from ..errors import ConfigError, LibreYOLOError
from ..logs import counted, setup_logging
from ..version import __version__
from .common import EXTRA, groups_help, keys_help, process_rank, user_errors
from .export import EXPORT_HELP, export_command

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Train object detectors fast, and know why a run is slow.")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"libreyolo {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Train object detectors fast, and know why a run is slow."""


# The keys `train --help` shows with their defaults: what most runs set (`libreyolo cfg` lists all).
MOST_USED = ("model", "data", "epochs", "batch", "imgsz", "device", "workers", "amp", "amp_dtype", "cuda_graph",
             "resume", "project", "name")


TRAIN_HELP = f"""Train a model: libreyolo train model=yolo9-t data=shapes epochs=10 [key=value ...]

Every key of `libreyolo cfg` can be set as key=value (or --key value). model= takes an
architecture (yolo9-t, resnet18, mobilenetv4-s), an official weights name (LibreYOLO9s.pt) or a
checkpoint file. The model's family says what it learns (task=, default its first task):
detectors read a built-in dataset (shapes, coco128), a YOLO dataset yaml or COCO json (an
instances_*.json, or a yaml with train: {{images, annotations}}); classifiers a built-in
set (shapes-cls), a folder with train/<class>/ and val/<class>/ image folders, or a yaml naming
them. resume=true continues the
newest run's last.pt; resume=path/last.pt a given one; under torchrun --max-restarts a restarted
run resumes by itself (checkpoint_steps=N: a last.pt every N optimizer steps). Progress and logs go to stderr (a live
bar on a terminal, plain lines in a log); the best checkpoint's path goes to stdout when done.

Most used keys (key=, default, meaning):

{keys_help(MOST_USED)}

Every key by group (`libreyolo cfg` prints each with its default, type and meaning; a model's
own defaults: `libreyolo cfg model=yolox-t`):

{groups_help()}
"""


@app.command(context_settings=EXTRA, help=TRAIN_HELP)
@user_errors
def train(ctx: typer.Context,
          as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout when done: run_dir, "
                                                             "best, metrics and timings.")) -> None:
    from .grammar import parse_overrides
    from .precheck import check_inputs

    setup_logging()
    args = parse_overrides(ctx.args)  # before importing torch: a typo answers instantly
    model = args.pop("model", None)
    resume = args.get("resume")
    if model is None and isinstance(resume, str) and resume not in ("", "false"):
        model = resume
    if model is None:
        raise LibreYOLOError("no model given: pass model=yolo9-t (architecture), model=LibreYOLO9s.pt or "
                             "model=path/to/last.pt")
    check_inputs(args, model)  # so is a missing file
    from ..engine.distributed import launch_for_devices
    from ..model import LibreYOLO

    # device=0,1: this command again as one process per GPU, under torch's elastic launcher.
    code = launch_for_devices(args.get("device"), [*ctx.args, *(["--json"] if as_json else [])])
    if code is not None:
        raise typer.Exit(code)
    result = LibreYOLO(model).train(**args)
    if process_rank():
        return  # rank 0 prints the result
    metrics = "  ".join(f"{k} {v:.4f}" for k, v in result.metrics.items() if isinstance(v, float))
    typer.echo(f"done: {counted(result.epochs_run, 'epoch')}, results in {result.run_dir}"
               + (f"; {metrics}" if metrics else ""), err=True)
    typer.echo(json.dumps({"run_dir": str(result.run_dir), "best": str(result.best), "task": result.task,
                           "metrics": result.metrics, "timings": result.timings}) if as_json else str(result.best))


def _val_help() -> str:
    from ..config import VAL_KEYS

    return f"""Validate a model: libreyolo val model=runs/train/exp/weights/best.pt [data=shapes] [--json]

Prints a per-class table on stderr and the headline metrics on stdout: for a detector images,
instances, P, R, mAP50, mAP50-95 per class and `mAP50-95 ... mAP50 ...`; for a classifier images,
top-1, top-5 per class and `top-1 ... top-5 ...`; for a point detector images, instances, P, R, F1
per class (a point within point_dist px of a box centre) and `F1 ... P ... R ...`; for a
segmentation model pixels, IoU, accuracy per class and `mIoU ... pixel acc ...`. A checkpoint
validates at the image size it was trained at, on its training dataset, unless imgsz= or data= say
otherwise; a log line says which size and dataset it used.

Keys (key=, default, meaning):

{keys_help(VAL_KEYS, {"data": "ckpt*", "imgsz": "ckpt*|640"})}

* the value the checkpoint was trained with; an architecture name has none (imgsz is then the
size's own default, which `libreyolo cfg model=NAME` shows).
"""


@app.command(context_settings=EXTRA, help=_val_help())
@user_errors
def val(ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout: the metrics, per_class "
                                                           "rows, and the imgsz and data used."),
        save_json: str = typer.Option(None, "--save-json", metavar="FILE",
                                      help="Detectors: also write the detections to FILE as a COCO results json "
                                           "(image_id, category_id, bbox, score; the dataset's own ids), for "
                                           "pycocotools or faster-coco-eval.")) -> None:
    from ..config import VAL_KEYS
    from .grammar import parse_overrides
    from .precheck import check_inputs

    setup_logging()
    args = parse_overrides(ctx.args, allowed=VAL_KEYS)
    model = args.pop("model", None)
    if model is None:
        raise LibreYOLOError("no model given: pass model=path/to/best.pt (or an architecture name)")
    check_inputs(args, model)  # before importing torch: a missing file answers instantly
    from ..model import LibreYOLO

    metrics = LibreYOLO(model).val(**args, **({"save_json": save_json} if save_json else {}))
    if as_json:
        typer.echo(json.dumps({k: v for k, v in metrics.items() if k != "curves"}))  # curves: results.html
    else:
        from ..tasks import get_task

        headline = get_task(metrics["task"]).summary(metrics, sep="  ")
        typer.echo(f"{headline}  ({metrics['num_images']} images)")


def _predict_help() -> str:
    from ..predict.options import KEYS

    width = max(len(k) for k in KEYS) + 1
    shown = {k: "ckpt*" if k == "imgsz" else "auto" if k == "device" else "(required)" if k == "source" else
             str(v.default).lower() if isinstance(v.default, bool) else str(v.default) for k, v in KEYS.items()}
    dw = max(len(v) for v in shown.values())
    rows = "\n".join(f"  {k + '=':<{width}}  {shown[k]:<{dw}}  {v.doc}" for k, v in KEYS.items())
    return f"""Predict: libreyolo predict model=runs/train/exp/weights/best.pt source=img.jpg [key=value ...] [--json]

source= is an image file, a folder (its images, by name), a glob ('imgs/*.jpg', quoted) or a video
file (.mp4, .avi, .mov, .mkv, ...; needs PyAV: pip install 'libreyolo[video]'). Images are
letterboxed exactly as val does, and boxes come back in original image pixels. stdout gets one
line per image (`name: 3 detections (2 circle, 1 square)`), or with --json one JSON object per
image: source, frame, width, height, task, then detections [{{box xyxy, score, class, name}}]
(detectors), points [{{point xy, score, class, name}}] (point detectors), class, name, prob and
top [{{class, name, prob}}] (classifiers), or classes [{{class, name, pixels, fraction}}]
(segmentation), and saved (the annotated file; segmentation also mask_saved, the class map as a
PNG of class ids) when save=true. Annotated images and videos go to project/name (runs/predict/exp,
exp2, ...). Progress and logs go to stderr.

Keys (key=, default, meaning):

\b
{rows}

* the size the checkpoint was trained at (an architecture name: its family's default).
"""


@app.command(context_settings=EXTRA, help=_predict_help())
@user_errors
def predict(ctx: typer.Context,
            as_json: bool = typer.Option(False, "--json", help="One JSON object per image on stdout (a JSON line).")
            ) -> None:
    import time

    from ..config import FIELDS
    from ..predict.options import KEYS
    from .grammar import parse_overrides
    from .precheck import check_model, check_source

    setup_logging()
    args = parse_overrides(ctx.args, allowed={"model", *KEYS}, types={k: v.type for k, v in KEYS.items()
                                                                     if k not in FIELDS})
    model, source = args.pop("model", None), args.pop("source", None)
    if model is None:
        raise LibreYOLOError("no model given: pass model=path/to/best.pt (or an architecture name)")
    if source is None:
        raise LibreYOLOError("no source given: pass source=img.jpg (an image file, a folder, a glob or a video)")
    check_model(model)  # before importing torch: a missing file answers instantly
    check_source(source)
    from ..model import LibreYOLO
    from ..predict.core import predict as run
    from ..predict.options import check_options

    opts = check_options({**args, "progress": True})
    from ..predict.sources import open_source

    open_source(source, vid_stride=opts["vid_stride"])  # the whole source checked before a model loads
    lib = LibreYOLO(model)
    start, n, saved_dir = time.perf_counter(), 0, None
    for result in run(lib._predictor, source, opts):
        n += 1
        saved = result.extra.get("saved")
        if saved:
            saved_dir = os.path.dirname(saved)
        if as_json:
            files = {k: result.extra[k] for k in ("saved", "mask_saved") if result.extra.get(k)}
            typer.echo(json.dumps({**result.to_dict(), **files}))
        else:
            where = f" [frame {result.frame}]" if result.frame is not None else ""
            typer.echo(f"{result.name}{where}: {result.summary()}")
    seconds = time.perf_counter() - start
    typer.echo(f"done: {counted(n, 'image')} in {seconds:.1f} s ({n / max(seconds, 1e-9):.1f}/s)"
               + (f"; annotated in {saved_dir}" if saved_dir else ""), err=True)


app.command("export", context_settings=EXTRA, help=EXPORT_HELP)(user_errors(export_command))


@app.command()
@user_errors
def cfg(model: str = typer.Argument(None, metavar="MODEL",
                                    help="Show the defaults this model trains with (`yolox-t` or `model=yolox-t`): "
                                         "an architecture, an official weights name or a checkpoint file."),
        as_json: bool = typer.Option(False, "--json", help="One JSON list of {key, default, type, group, doc} "
                                                           "(and source, with a model)."),
        markdown: bool = typer.Option(False, "--markdown", help="The docs/hyperparameters.md tables.")) -> None:
    """Print every training key with its default, type and meaning, under a header row.

    With a model, the defaults are the ones that model trains with, and a `source` column says
    where each comes from: base, the family's published recipe (e.g. yolox) or its size's (e.g.
    yolox-t); "long runs" marks a published value that recipe=auto uses only in runs of over
    10,000 optimizer steps."""
    from ..config import config_table

    if as_json and markdown:
        raise ConfigError("--json and --markdown are two forms of the same table: choose one")
    sources = None
    if model is not None:
        if markdown:
            raise ConfigError("--markdown prints the generic tables of docs/hyperparameters.md; leave out the model")
        from ..resolve import arch_of

        spec, size = arch_of(model.removeprefix("model="))
        # A long-run key is the family's only in runs recipe=auto finds long (engine/recipe.py).
        sources = {k: (v, f"{where}, long runs" if k in spec.long_run else where)
                   for k, (v, where) in spec.default_sources(size).items()}
    rows = config_table(sources)
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    if markdown:
        from ..docs import hyperparameters_markdown

        typer.echo(hyperparameters_markdown(), nl=False)
        return
    # A header row names the columns; `source` is where a model's default comes from.
    columns = ("key", "default", "type") + (("source",) if sources is not None else ())
    header = {**{c: c for c in columns}, "doc": "meaning"}
    width = {c: max(len(r[c]) for r in [header, *rows]) for c in columns}
    for r in [header, *rows]:
        typer.echo("  ".join(f"{r[c]:<{width[c]}}" for c in columns) + f"  {r['doc']}")


# Click's exceptions, wherever this typer takes Click from (newer typers vendor their own copy).
_CLICK = sys.modules[typer.BadParameter.__module__]
_NO_ARGS_IS_HELP = getattr(_CLICK, "NoArgsIsHelpError", ())  # Click >= 8.2, for `no_args_is_help`


def usage_error_line(exc) -> str:
    """Click's own mistakes (an option out of range, a missing argument) as our one line: its
    standard form is four lines of usage and a box around the message."""
    message = " ".join(exc.format_message().split()).rstrip(".")
    where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    return f"{message[:1].lower()}{message[1:]}{where}"


def main(argv: list[str] | None = None) -> None:
    from ..signals import exit_code, install, interrupted_line, restore, unsaid

    saved = install()  # first: a SIGTERM or Ctrl-C at start-up is the same one line as one mid-run
    try:
        _main(argv)
    except KeyboardInterrupt as exc:  # outside a command (its import, the argument parsing)
        typer.echo(f"error: {interrupted_line(exc)}", err=True)
        sys.exit(exit_code(exc))
    except Exception:
        pending = unsaid()
        if pending is None:
            raise
        typer.echo(f"error: {interrupted_line(pending)}", err=True)  # what it broke is not the news
        sys.exit(exit_code(pending))
    finally:
        restore(saved)  # main() run in-process (tests, a notebook) leaves the handlers as it found them


def _main(argv: list[str] | None) -> None:
    from .bench import bench_app
    from .data import data_app
    from .profile import profile_app

    if not getattr(app, "_libreyolo_groups", False):  # main() may run many times in one process
        app.add_typer(bench_app, name="bench")
        app.add_typer(data_app, name="data")
        app.add_typer(profile_app, name="profile")
        app._libreyolo_groups = True
    # standalone_mode=False hands Click's usage errors to us instead of printing them its way.
    try:
        code = app(args=argv, prog_name="libreyolo", standalone_mode=False)
    except _CLICK.UsageError as exc:
        if isinstance(exc, _NO_ARGS_IS_HELP) or os.environ.get("LIBREYOLO_DEBUG"):
            exc.show()  # a bare `libreyolo profile`: the help is the answer
            sys.exit(exc.exit_code)
        typer.echo(f"error: {usage_error_line(exc)}", err=True)
        sys.exit(2)
    except _CLICK.ClickException as exc:
        typer.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, KeyboardInterrupt):  # Click turns a Ctrl-C into Abort
            raise cause from None
        typer.echo("aborted", err=True)
        sys.exit(1)
    if isinstance(code, int) and code:  # typer.Exit(n) comes back as n without standalone_mode
        from ..signals import unsaid

        if code == 130 and unsaid() is not None:  # typer's own silent 130 for a signal while parsing
            raise unsaid()
        sys.exit(code)

