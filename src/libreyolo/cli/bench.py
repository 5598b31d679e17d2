"""`libreyolo bench step`: the step benchmark the docs quote (method in libreyolo/bench.py)."""

from __future__ import annotations

import json

import typer

from ..logs import setup_logging
from .common import EXTRA, groups_help, keys_help, user_errors

bench_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                        help="Benchmarks whose figures the docs quote.")

# The keys `bench step --help` shows with their defaults: what the arms change, and the batch timed.
# Every training key is accepted (parse_overrides' default), and the help lists them all by group.
STEP_KEYS = ("model", "data", "task", "batch", "imgsz", "device", "amp", "amp_dtype", "cuda_graph", "compile",
             "channels_last")

STEP_HELP = f"""Time the real training step: libreyolo bench step model=yolo9-t batch=8 imgsz=640 [key=value ...]

The dataloader is left out: one real batch of `data` (default: the task's built-in set) is
replayed. Each arm runs in its own process from the same saved initial state; the fastest and
median of --steps steps after --warmup are reported, with kernel-busy time and utilisation on
CUDA, a synced breakdown (forward / loss / backward / optimizer+EMA) and peak memory. Every key
of `libreyolo cfg` can be set as key=value (or --key value); each arm sets its own keys on top
(arms=LIST is the same as --arms LIST).

Most used keys (key=, default, meaning):

{keys_help(STEP_KEYS, {"model": "(required)", "data": "built-in*"})}

* the task's built-in set: shapes (detect, points), shapes-cls (classify) or shapes-seg (segment).

Every key by group (`libreyolo cfg` prints each with its default, type and meaning):

{groups_help()}
"""


@bench_app.command(context_settings=EXTRA, help=STEP_HELP)
@user_errors
def step(ctx: typer.Context,
         arms: str = typer.Option("eager", help="Comma-separated arms: eager, fp32, float16, bfloat16, graph, full "
                                                 "(cuda_graph=full), compile, nchw, nhwc; combine with '+', e.g. "
                                                 "float16,float16+graph,float16+full+compile. An arm whose lever "
                                                 "cannot act on the device (float16, bfloat16, graph or full on a "
                                                 "CPU) is refused before any arm runs."),
         steps: int = typer.Option(24, min=2, help="Timed steps per arm."),
         warmup: int = typer.Option(10, min=1, help="Warm-up steps per arm before timing."),
         repeat: int = typer.Option(1, min=1, help="Processes per arm, arms interleaved; the median run is "
                                                   "reported with every run's median and the spread."),
         as_json: bool = typer.Option(False, "--json", help="One JSON list of per-arm records on stdout.")) -> None:
    from ..bench import bench_step, format_table, parse_arms
    from .grammar import parse_overrides
    from .precheck import check_inputs

    setup_logging()
    # arms=... is accepted in the key=value style too.
    arm_tokens = [t for t in ctx.args if t.startswith("arms=")]
    arms = arm_tokens[-1].split("=", 1)[1] if arm_tokens else arms
    tokens = [t for t in ctx.args if not t.startswith("arms=")]
    user = parse_overrides(tokens)
    if "model" not in user:
        from ..errors import ConfigError

        raise ConfigError("no model given: pass model=yolo9-t (or a checkpoint)")
    check_inputs(user)  # before the bench imports torch: a missing file answers instantly
    results = bench_step(user, parse_arms(arms), steps=steps, warmup=warmup, repeat=repeat)
    typer.echo(json.dumps(results, indent=1) if as_json else format_table(results))
