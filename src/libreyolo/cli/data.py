"""`libreyolo data check|convert`: look at a detection dataset before training on it, or change its
format (data/check.py, data/convert.py)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..atomic import check_writable
from ..logs import setup_logging
from .common import EXTRA, rows_help, user_errors

data_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                       help="Look at a detection dataset (check) or change its format (convert).")

# The keys each command takes, {key: (default, meaning)}: what it parses, and its --help table.
DATA_KEY = ("(required)", "the detection dataset: a built-in name, a dataset yaml or a COCO instances_*.json")
CHECK_KEYS = {"data": DATA_KEY,
              "imgsz": ("640", "the size the boxes' shorter-side histogram is taken at (long side resized to it)"),
              "out": ("runs/data/NAME_check.html", "the report page, one self-contained HTML file")}
CONVERT_KEYS = {"data": DATA_KEY,
                "to": ("(required)", "the format to write: coco or yolo"),
                "out": ("(required)", "the new folder (it must not exist)")}

CHECK_HELP = f"""Report on a dataset: libreyolo data check data=my.yaml [imgsz=640] [out=FILE.html] [--json]

data= is anything a detector trains on: a built-in name, a YOLO dataset yaml, a COCO
instances_*.json or a yaml with train: {{images, annotations}}. Every image is decoded and hashed
(in threads). The report: images, boxes and backgrounds (images without a box) per split;
boxes and images per class; corrupt or undecodable images; label files training would skip
(and why); byte-identical images within a split and between train and val; boxes outside the
image or of no size; a histogram of the boxes' shorter side at imgsz (the long side resized to
imgsz, as training does), counting the boxes that shrink below 4 px. stdout gets the one-line
verdict (`train` prints the same at its start, from labels and sizes only); the page, one
self-contained HTML file with plotly charts, goes to out= (default runs/data/NAME_check.html).

Keys (key=, default, meaning):

{rows_help(CHECK_KEYS)}
"""

CONVERT_HELP = f"""Convert a detection dataset: libreyolo data convert data=my.yaml to=coco out=DIR

to=coco writes DIR/annotations/instances_{{train,val}}.json (category id = class + 1) and
DIR/data.yaml naming the original image folders (nothing copied). to=yolo writes
DIR/images/{{train,val}}/ (hard links, else copies), DIR/labels/{{train,val}}/*.txt and DIR/data.yaml;
the classes are the categories in id order, and iscrowd boxes are left out (counted). DIR must
not exist; a conversion that fails leaves nothing. stdout gets the new data.yaml, ready for
`libreyolo train data=...`.

Keys (key=, default, meaning):

{rows_help(CONVERT_KEYS)}
"""


@data_app.command(context_settings=EXTRA, help=CHECK_HELP)
@user_errors
def check(ctx: typer.Context,
          as_json: bool = typer.Option(False, "--json", help="Print the whole report as one JSON object on stdout "
                                                             "(schema libreyolo-data-check, with the page's path)."),
          strict: bool = typer.Option(False, "--strict", help="Exit 1 when the verdict is not ok (a CI gate).")) -> None:
    from ..data.check import check_dataset
    from ..data.check_page import write_page
    from .grammar import parse_overrides
    from .precheck import check_data

    setup_logging()
    args = parse_overrides(ctx.args, allowed=CHECK_KEYS, types={"out": str})
    data = _need_data(args)
    check_data(data)
    imgsz = int(args.get("imgsz", CHECK_KEYS["imgsz"][0]))
    if args.get("out"):  # before the images are decoded
        check_writable(args["out"], "report page")
    report = check_dataset(data, imgsz)
    page = Path(args.get("out") or Path("runs") / "data" / f"{report['data']}_check.html")
    write_page(page, report)
    report["html"] = str(page)
    typer.echo(f"page: {page}", err=True)
    typer.echo(json.dumps(report) if as_json else report["verdict"])
    if strict and not report["ok"]:
        raise typer.Exit(1)


@data_app.command(context_settings=EXTRA, help=CONVERT_HELP)
@user_errors
def convert(ctx: typer.Context,
            as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout: data_yaml, format, "
                                                               "and per split images, boxes and crowd boxes left out.")
            ) -> None:
    from ..data.convert import FORMATS
    from ..data.convert import convert as run
    from ..errors import ConfigError
    from .grammar import parse_overrides
    from .precheck import check_data

    setup_logging()
    args = parse_overrides(ctx.args, allowed=CONVERT_KEYS, types={"to": str, "out": str})
    data = _need_data(args)
    if args.get("to") not in FORMATS:
        raise ConfigError(f"to= must be one of {', '.join(FORMATS)} (got {args.get('to')!r})")
    if not args.get("out"):
        raise ConfigError("no out= given: name the new folder for the converted dataset")
    check_data(data)
    result = run(data, args["to"], args["out"])
    for split, v in result["splits"].items():
        typer.echo(f"{split}: {v['images']} images, {v['boxes']} boxes"
                   + (f" ({v['crowd']} crowd boxes left out)" if v["crowd"] else ""), err=True)
    typer.echo(json.dumps(result) if as_json else result["data_yaml"])


def _need_data(args: dict) -> str:
    from ..errors import ConfigError

    data = args.get("data")
    if not data:
        raise ConfigError("no dataset given: pass data=NAME (a built-in name, a dataset yaml or an instances json)")
    return str(data)
