"""`libreyolo export`: a model to an ONNX file or a torch.export program (libreyolo/export.py).

Registered in app.py as `app.command("export", context_settings=EXTRA, help=EXPORT_HELP)(
user_errors(export_command))`. Nothing here imports app.py (app.py imports this) nor torch: a
mistyped key, format or path answers before torch is loaded.
"""

from __future__ import annotations

import json
from typing import Union

import typer

from ..errors import ConfigError
from ..export import EXPORT_KEYS, FORMATS, MIN_OPSET, TOLERANCE

# The export keys that are not training keys, with their types (model, imgsz, batch and device
# parse as the training keys of the same name do).
TYPES = {"format": str, "dynamic": bool, "opset": Union[int, None], "output": Union[str, None], "check": bool}

EXPORT_HELP = f"""Export a model: libreyolo export model=runs/train/exp/weights/best.pt [format=onnx] [key=value ...] [--json]

Writes one file that computes the model's prediction, decode included: ONNX (onnxruntime,
TensorRT, OpenVINO; needs pip install 'libreyolo[export]') or pt2 (a torch.export program:
torch.export.load(path).module()). The file is run and compared with PyTorch before it is kept
(check=true): a file that disagrees is not written. stdout gets the file's path (or one JSON
object with --json); logs go to stderr.

Input `images`: float32 [B, 3, S, S], RGB, values in [0, 1], prepared as val prepares an image:
detectors letterbox it (long side resized to S, centred on an S x S canvas of grey 114/255);
classifiers resize its short side to round(S / 0.875) and crop the centre S x S.

Output `output`: detectors [B, N, 4 + classes], one row per anchor: box x1 y1 x2 y2 in input
pixels, then a score in [0, 1] per class; classifiers [B, classes] probabilities. NMS is not in
the file: keep each row's best class above a confidence (0.25), then class-aware NMS (IoU 0.7,
torchvision.ops.batched_nms), and map boxes back with (x - left) / ratio; docs/export.md shows it.

Keys (key=, default, meaning):

\b
  model=    (required)  checkpoint file, official weights name or architecture (yolo9-t)
  format=   onnx        {' or '.join(FORMATS)}
  imgsz=    ckpt*       input size S, a multiple of the model's largest stride (32)
  batch=    1           input batch size
  dynamic=  false       true: any batch size (H and W stay S: the anchor grid is fixed)
  opset=    exporter's  ONNX opset, >= {MIN_OPSET} (torch 2.11-2.14 write 20)
  device=   cpu         where a pt2 program is traced and runs (ONNX is exported on the CPU)
  output=   beside      the file, or a folder for it (default: best.pt -> best.onnx beside it;
                        an architecture name -> ./yolo9-t.onnx)
  check=    true        run the file and compare: boxes within {TOLERANCE['boxes']} px, scores and
                        probabilities within {TOLERANCE['scores']:g}

* the size the checkpoint was trained at (an architecture name: the size's own default, which
`libreyolo cfg model=NAME` shows: 640 for most detectors, 224 for classifiers).
"""


def export_command(ctx: typer.Context,
                   as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout: path, format, "
                                                                      "shapes, size_bytes, opset, max_abs_diff, "
                                                                      "seconds.")) -> None:
    from ..export import export_model
    from ..logs import setup_logging
    from .grammar import parse_overrides
    from .precheck import check_model

    setup_logging()
    args = parse_overrides(ctx.args, allowed=EXPORT_KEYS, types=TYPES)
    model = args.pop("model", None)
    if model is None:
        raise ConfigError("no model given: pass model=path/to/best.pt (or an architecture name, e.g. yolo9-t)")
    check_model(model)  # a missing weights file answers before torch is imported
    result = export_model(model, **args)
    typer.echo(json.dumps(result.to_dict()) if as_json else str(result.path))
