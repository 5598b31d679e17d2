"""Export a model for deployment: ONNX (onnxruntime, TensorRT, OpenVINO, ...) or a torch.export
program (`.pt2`, for PyTorch runtimes without the LibreYOLO sources). docs/export.md is the guide.

The file computes `model.predict(images)` of the deploy form, the decode included, and nothing more
(the deploy form is predict's: every block with `fuse_` folded, BatchNorm into its conv and the
re-parameterisable blocks, YOLOv7's RepConv, YOLOv9's RepConvN and YOLO-NAS's QARepVGG, merged
into one conv):
- input `images`: float32 [B, 3, S, S], RGB, values in [0, 1], prepared as validation and predict
  prepare an image (`task.prepare`): a detector's image is resized to long side S and centred on an
  S x S canvas of grey 114 (data/augment.FILL; 114 / 255 after scaling); a classifier's is resized
  to short side round(S / 0.875) and centre-cropped to S x S; a segmentation network's resized
  to S x S (bilinear);
- output `output`: detection [B, N, 4 + nc], boxes xyxy in input pixels, then per-class scores in
  [0, 1], one row per anchor (N = the sum over strides s of (S / s)^2, times 3 for YOLOv7's three
  anchors per cell, `rows_per_cell`; a DETR: one row per query, N = min(300, that sum)); classification [B, nc] probabilities (softmax); point detection
  [B, 1 + nc, S / 8, S / 8] per-cell probabilities (softmax, background first); segmentation
  [B, nc, S, S] per-pixel probabilities (softmax, the logits upsampled bilinearly to S x S inside
  the file).
No family has NMS in its network and none is added to the file: detections are class-aware NMS
over the per-class scores, as `eval.postprocess.postprocess` and predict do it: each row keeps its
best class if that score passes `conf` (predict: 0.25), NMS per class at IoU 0.7
(torchvision.ops.batched_nms), at most 300 per image by score. An end-to-end model (the DETRs,
`model.end_to_end`) needs no NMS: its detections are the 300 best (query, class) scores above
`conf` (`eval.postprocess.top_k`). Then a box returns to the original
image as (x - left) / ratio, (y - top) / ratio, with ratio = S / max(h, w) and (left, top) the
canvas padding.

Both formats come from one torch.export trace of `predict`. ONNX is converted from that program
by torch's torch.export-based exporter (`torch.onnx.export(..., dynamo=True)`), not the
TorchScript one: both export the five families on torch 2.11 and 2.14 and match PyTorch alike,
but the TorchScript exporter is deprecated (every call warns that "the feature will be removed")
and the torch.export path is the one torch develops and makes the default.

Every export is checked before it is kept (`check=True`): the written file runs on shapes images
(data/shapes.py, seeded) prepared as above, onnxruntime on the CPU for ONNX and torch.export.load
for pt2, and its output must match the PyTorch model's within TOLERANCE at the export's batch and,
with `dynamic=True`, at a second batch size. The file is written under a temporary name and
renamed only after the check passed, so a failed export leaves nothing behind.

Nothing here imports torch at module level: the CLI answers a bad format or a missing package
before paying for it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import time
import warnings
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .atomic import atomic_path, check_writable
from .errors import ConfigError, LibreYOLOError
from .version import __version__

log = logging.getLogger("libreyolo")

FORMATS = {"onnx": ".onnx", "pt2": ".pt2"}  # format -> file suffix
# What a format needs besides torch (the `libreyolo[export]` extra): its exporter and its check.
NEEDS = {"onnx": ("onnx", "onnxscript", "onnxruntime"), "pt2": ()}
EXPORT_KEYS = ("model", "format", "imgsz", "batch", "dynamic", "opset", "device", "output", "check")
# torch's exporter writes opset 18 and up: asked for less, it prints a traceback and writes 18.
MIN_OPSET = 18
# A classifier has no anchor grid; ResNet and MobileNetV4 downsample by 32 before their global
# pooling, the multiple the config asks of every imgsz.
CLASSIFIER_STRIDE = 32
# Largest |file - PyTorch| allowed per output part. Measured (onnxruntime 1.32 on the CPU against
# torch 2.14 and 2.11 on the CPU, every family, 64 to 640 px, random, perturbed and trained
# weights; docs/export.md): at most 0.0026 px on boxes (a trained YOLOv9-t at 640), 3.2e-6 on
# scores, 1.0e-5 on probabilities (MobileNetV4-S, 1000 classes); a pt2 program matches exactly.
# 10-30x that: a file that computes something else (a misplaced anchor, a dropped layer) is off
# by pixels.
TOLERANCE = {"boxes": 0.05, "scores": 1e-4, "probs": 1e-4}
UNITS = {"boxes": " px"}
CHECK_SEED = 20240101  # the shapes images the check runs on
META_FILE = "libreyolo.json"  # a pt2 file's metadata (torch.export.save extra_files)
# Per task: how an image becomes the input, and what to do with the output (metadata, log line).
TASK_NOTES = {
    "detect": ("long side resized to S, centred on an S x S canvas of grey 114/255 (letterbox)",
               "no NMS in the file: keep each row's best class above conf, then class-aware NMS "
               "(docs/export.md)"),
    "classify": ("short side resized to round(S / 0.875), centre crop S x S",
                 "the output is probabilities: the argmax is the class"),
    "points": ("long side resized to S, centred on an S x S canvas of grey 114/255 (letterbox)",
               "per-cell probabilities, background first: a cell above conf (0.5) is a point of its class, "
               "8-connected cells of a class one point at their cells' centre (docs/points.md)"),
    "segment": ("resized to S x S (bilinear)",
                "the output is per-pixel probabilities [B, classes, S, S]: resize them to the image's size, "
                "then the argmax over classes is each pixel's class"),
}
END_TO_END_NOTE = ("no NMS needed (one row per query): the best max_det (query, class) scores above conf "
                   "(docs/export.md)")


class ExportCheckError(LibreYOLOError):
    """The exported file does not compute what the PyTorch model computes."""


@dataclass
class ExportResult:
    path: Path
    format: str                      # "onnx" | "pt2"
    arch: str                        # "yolo9-t"
    task: str                        # "detect" | "classify" | "points" | "segment"
    imgsz: int
    batch: int                       # the input's batch; with `dynamic`, the first batch checked
    dynamic: bool                    # batch axis dynamic
    input_shape: list                # [B, 3, S, S]; B is "batch" when dynamic
    output_shape: list               # [B, N, 4 + nc] or [B, nc]
    size_bytes: int
    opset: int | None                # the ONNX opset written; None for pt2
    max_abs_diff: dict[str, float] = field(default_factory=dict)  # per output part; empty with check=False
    checked_batches: list[int] = field(default_factory=list)
    seconds: float = 0.0             # wall time, from resolving the model to the file in place

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (`libreyolo export --json`)."""
        return {**asdict(self), "path": str(self.path)}


def export_model(model: str, *, format: str = "onnx", imgsz: int | None = None, batch: int = 1,
                 dynamic: bool = False, opset: int | None = None, device: str = "cpu",
                 output: str | Path | None = None, check: bool = True, **unknown: Any) -> ExportResult:
    """Export `model` (a checkpoint file, an official weights name or an architecture name, as
    `resolve.resolve_model` reads it) as `format` and return what was written.

    imgsz: the square input size; default the checkpoint's training size, else the family's
    default (640 detectors, 224 classifiers). batch: the input's batch size; with `dynamic` the
    batch axis takes any size >= 1. opset: the ONNX opset, >= 18 (default: the exporter's, 20 on
    torch 2.11-2.14). device: where a pt2 program is traced and runs (an ONNX file holds no
    device: it is exported on the CPU). output: the file, or an existing folder for it; default
    beside the checkpoint (best.pt -> best.onnx), else <arch>.<format> in the current directory.
    check: run the file and compare it with PyTorch before keeping it (module docstring).
    A mistake is one LibreYOLOError line; so is a failed check, which writes nothing.
    """
    start = time.perf_counter()
    if unknown:
        from .config import unknown_key_message

        raise ConfigError(unknown_key_message(next(iter(unknown)), EXPORT_KEYS))
    format = _check_request(format, imgsz, batch, dynamic, opset, device, check)
    from .logs import checking_inputs
    from .resolve import resolve_model

    with checking_inputs():  # a refused request prints its one line and nothing before it
        source = resolve_model(model)
        built = _build(source, imgsz, device if format == "pt2" else "cpu")
        path = _output_path(model, source, format, output)
    if source.checkpoint is None:
        log.warning(f"exporting {built.arch} with random weights (no checkpoint given)")
    what = f"{built.arch} ({built.task.name}, {len(built.names)} classes)"
    log.info(f"exporting {what} to {format} at {built.imgsz} px, batch {'dynamic' if dynamic else batch}")
    batches = [batch, 2 if batch == 1 else 1] if dynamic else [batch]
    images = sample_images(built.task, built.imgsz, max(batches), built.device)
    # The eager outputs first: they are the check's reference, and the call fills the anchor
    # caches (families/common.AnchorCache) with real tensors, which the trace then reads as
    # constants; a trace on a cold cache would leave its fake tensors there.
    refs = {b: built.predict(images[:b]) for b in batches}
    # torch.export turns an axis of size 1 into a constant: a dynamic batch is traced at 2 or more.
    program = _trace(built.module, images[: max(batches)] if dynamic else images, dynamic)
    meta = _metadata(built)
    with _removing_new_folders(path.parent), atomic_path(path, suffix=FORMATS[format]) as tmp:
        written_opset = _write_onnx(program, tmp, opset, meta) if format == "onnx" else _write_pt2(program, tmp, meta)
        diffs = _check(format, tmp, images, refs) if check else {}
    size, seconds = path.stat().st_size, time.perf_counter() - start
    b: Any = "batch" if dynamic else batch
    result = ExportResult(path=path, format=format, arch=built.arch, task=built.task.name, imgsz=built.imgsz,
                          batch=batch, dynamic=dynamic, input_shape=[b, 3, built.imgsz, built.imgsz],
                          output_shape=[b, *refs[batch].shape[1:]], size_bytes=size, opset=written_opset,
                          max_abs_diff=diffs, checked_batches=batches if check else [], seconds=round(seconds, 2))
    checked = (f"max |diff| vs PyTorch {_describe(diffs)} at batch {' and '.join(map(str, batches))}"
               f" ({'onnxruntime CPU' if format == 'onnx' else 'torch.export.load'})" if check else "not checked")
    kind = f"ONNX opset {written_opset}" if format == "onnx" else "torch.export program"
    log.info(f"exported {what} to {path} ({kind}, {size / 1e6:.1f} MB, {seconds:.1f} s): images float32 "
             f"{result.input_shape} -> output {result.output_shape}; {checked}; "
             f"{built.post_note}")
    return result


def _check_request(format: Any, imgsz: Any, batch: Any, dynamic: Any, opset: Any, device: Any, check: Any) -> str:
    """Everything that can be refused before torch is imported; returns the format, lower case."""
    if not isinstance(format, str) or format.strip().lower() not in FORMATS:
        raise ConfigError(f"unknown export format {format!r} (formats: {', '.join(FORMATS)})")
    format = format.strip().lower()
    if not _is_int(batch) or batch < 1:
        raise ConfigError(f"bad value for 'batch': {batch!r} (allowed: an int >= 1)")
    if imgsz is not None and (not _is_int(imgsz) or imgsz < 1):
        raise ConfigError(f"bad value for 'imgsz': {imgsz!r} (allowed: a positive multiple of the model's largest "
                          f"stride, 32 for most families, 8 for FOMO, e.g. 640)")
    for key, value in (("dynamic", dynamic), ("check", check)):
        if not isinstance(value, bool):
            raise ConfigError(f"bad value for '{key}': {value!r} (allowed: true or false)")
    if opset is not None and format != "onnx":
        raise ConfigError(f"opset applies to format=onnx only (this is format={format}); drop opset=")
    if opset is not None and (not _is_int(opset) or opset < MIN_OPSET):
        raise ConfigError(f"bad value for 'opset': {opset!r} (allowed: an int >= {MIN_OPSET}, the lowest opset "
                          f"torch's exporter writes; or leave it out for the exporter's default)")
    if format == "onnx" and str(device).strip().lower() != "cpu":
        raise ConfigError(f"device={device}: an ONNX file holds no device and is exported on the CPU; drop device= "
                          f"(it places a format=pt2 program)")
    missing = [m for m in NEEDS[format] if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"export format={format} needs {_and(NEEDS[format])} (missing: {', '.join(missing)}): "
                          f"pip install 'libreyolo[export]'")
    if opset is not None:
        import onnx

        newest = onnx.defs.onnx_opset_version()
        if opset > newest:
            raise ConfigError(f"bad value for 'opset': {opset} (onnx {onnx.__version__} knows opsets up to {newest})")
    return format


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _and(names: tuple[str, ...]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


@dataclass
class _Built:
    """The model to export, built as val builds it (eval mode, float32), with what the file says
    about it."""

    arch: str
    family: str
    task: Any            # tasks.TaskSpec
    names: list[str]
    imgsz: int
    stride: int
    module: Any          # nn.Module whose forward is model.predict: what torch.export traces
    device: Any
    end_to_end: bool = False  # a DETR: top-k over (query, class), no NMS

    @property
    def post_note(self) -> str:
        """What to do with the output (metadata, log line)."""
        if self.end_to_end and self.task.name == "detect":
            return END_TO_END_NOTE
        return TASK_NOTES.get(self.task.name, ("", ""))[1]

    def predict(self, images):
        import torch

        with torch.no_grad():
            return self.module(images)


def _build(source, imgsz: int | None, device: str) -> _Built:
    from .engine.builder import build_model
    from .families.common import fuse_model_
    from .resolve import inference_setup

    task, names, imgsz, target = inference_setup(source, imgsz, device, "export")
    # The deploy form, as predict's: BatchNorm folded into the convs, re-parameterised blocks
    # (YOLOv7's RepConv and implicit layers, YOLOv9's RepConvN, RT-DETR's RepVGG) merged.
    model = fuse_model_(build_model(source, len(names), exact=True).float().eval()).to(target)
    stride = max(getattr(model, "strides", (CLASSIFIER_STRIDE,)))
    if imgsz % stride or imgsz < stride:
        below = imgsz // stride * stride
        sizes = f"{below} or {below + stride}" if below else f"{stride}"
        raise ConfigError(f"imgsz={imgsz} is not a multiple of {stride}, the largest stride of {source.arch}: "
                          f"use {sizes}")
    return _Built(source.arch, source.spec.name, task, names, int(imgsz), int(stride), _predict_module(model), target,
                  bool(getattr(model, "end_to_end", False)))


def _predict_module(model):
    """`model.predict` as the forward of an nn.Module in eval mode (torch.export traces forward)."""
    from torch import nn

    class Predict(nn.Module):
        def __init__(self, inner: nn.Module):
            super().__init__()
            self.model = inner

        def forward(self, images):
            return self.model.predict(images)

    return Predict(model).eval()


def _output_path(model: str, source, format: str, output: str | Path | None) -> Path:
    """Where the file goes: `output` (a file, or an existing folder for the default name), else
    beside the checkpoint file, else <official name or arch>.<format> in the current directory."""
    suffix = FORMATS[format]
    given_file = source.path is not None and Path(model).expanduser().is_file()
    if given_file:
        default = source.path.with_suffix(suffix)
    else:  # an official weights name (its file lives in the cache) or an architecture name
        default = Path((source.path.stem if source.path is not None else source.arch) + suffix)
    if output is None:
        return default
    path = Path(output).expanduser()
    path = path / default.name if path.is_dir() else path
    if source.path is not None and path.resolve() == source.path.resolve():
        raise ConfigError(f"output={output} is the checkpoint itself; name another file (e.g. {default.name})")
    if path.suffix in FORMATS.values() and path.suffix != suffix:
        raise ConfigError(f"output={output} names a {path.suffix} file but format={format} writes {suffix}: "
                          f"name it {path.with_suffix(suffix).name}, or pass format={path.suffix[1:]}")
    return check_writable(path, "export file")


@contextlib.contextmanager
def _removing_new_folders(folder: Path):
    """Create `folder` (and missing parents) for the file; remove the ones created here if the
    export fails, so a failed export leaves nothing behind."""
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        for p in created:  # innermost first; rmdir leaves a folder something else wrote into
            with contextlib.suppress(OSError):
                p.rmdir()
        raise


def sample_images(task, imgsz: int, n: int, device=None):
    """`n` shapes images (data/shapes.render_image, seeded: the same every call) prepared by
    `task.prepare` as validation prepares them: float32 [n, 3, imgsz, imgsz] in [0, 1]. Real
    images reach more of the score range than noise does."""
    import numpy as np
    import torch

    from .data.shapes import render_image

    images = []
    for i in range(n):
        hwc, _ = render_image(np.random.default_rng([CHECK_SEED, i]))
        images.append(task.prepare(torch.from_numpy(hwc).permute(2, 0, 1).contiguous(), imgsz)[0])
    return torch.stack(images).to(device).float().div_(255)


@contextlib.contextmanager
def _quiet():
    """The exporters' own deprecation notices (torch internals calling each other) are not the
    user's to act on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def _trace(module, example, dynamic: bool):
    import torch

    shapes = {"images": {0: torch.export.Dim("batch", min=1)}} if dynamic else None
    with _quiet():
        return torch.export.export(module, (example,), dynamic_shapes=shapes)


def _metadata(built: _Built) -> dict[str, str]:
    """What the file says about itself: ONNX metadata_props, a pt2 file's libreyolo.json."""
    prepare, post = TASK_NOTES.get(built.task.name, ("", ""))[0], built.post_note
    return {"libreyolo": __version__, "task": built.task.name, "family": built.family, "arch": built.arch,
            "imgsz": str(built.imgsz), "stride": str(built.stride), "names": json.dumps(built.names),
            "input": f"images: float32 [B, 3, {built.imgsz}, {built.imgsz}], RGB, values in [0, 1]; {prepare}",
            "output": f"output: {built.task.predicts}", "postprocess": post}


def _write_onnx(program, path: Path, opset: int | None, meta: dict[str, str]) -> int:
    """The ONNX file at `path`; returns the opset written."""
    import torch

    with _quiet():
        onnx_program = torch.onnx.export(program, dynamo=True, opset_version=opset, input_names=["images"],
                                         output_names=["output"], verbose=False)
    onnx_program.model.metadata_props.update(meta)
    # The weights stay inside the one file (no .onnx.data beside it): the models are far below
    # protobuf's 2 GB limit, and one file is one atomic rename.
    onnx_program.save(str(path), external_data=False)
    return int(onnx_program.model.opset_imports[""])


def _write_pt2(program, path: Path, meta: dict[str, str]) -> None:
    import torch

    # Without the trace's example images, which the file would carry too (4.9 MB a 640 px image).
    program.example_inputs = None
    # Through memory: saved to a path, the archive's top folder would take the temporary name.
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={META_FILE: json.dumps(meta)})
    path.write_bytes(buffer.getbuffer())


def _check(format: str, path: Path, images, refs: dict) -> dict[str, float]:
    """Run the written file at every batch of `refs` ({batch: PyTorch output}); the largest
    |difference| per output part, or one ExportCheckError line when one exceeds TOLERANCE."""
    run = _onnx_runner(path) if format == "onnx" else _pt2_runner(path)
    diffs: dict[str, float] = {}
    for b, ref in refs.items():
        out = run(images[:b])
        if tuple(out.shape) != tuple(ref.shape):
            raise ExportCheckError(f"export check failed: at batch {b} the file gives output {list(out.shape)}, "
                                   f"PyTorch {list(ref.shape)}; nothing was written")
        for part, (got, want) in _parts(out.to(ref.device), ref).items():
            d = float((got - want).abs().max())  # NaN propagates: a NaN fails the test below
            if not d <= TOLERANCE[part]:
                unit = UNITS.get(part, "")
                raise ExportCheckError(f"export check failed: at batch {b} the {format} file's {part} differ from "
                                       f"PyTorch's by up to {d:.3g}{unit} (tolerance {TOLERANCE[part]:g}{unit}); "
                                       f"nothing was written (check=false writes it unchecked)")
            diffs[part] = max(diffs.get(part, 0.0), d)
    return diffs


def _parts(out, ref) -> dict[str, tuple]:
    """Detection [B, N, 4 + nc] splits into boxes (pixels) and scores; anything else is probs."""
    if out.ndim == 3:
        return {"boxes": (out[..., :4], ref[..., :4]), "scores": (out[..., 4:], ref[..., 4:])}
    return {"probs": (out, ref)}


def _onnx_runner(path: Path):
    import onnxruntime as ort
    import torch

    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only: its notes on graph rewrites are not the user's business
    session = _ort_call(lambda: ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]), "load")
    return lambda x: torch.from_numpy(_ort_call(lambda: session.run(None, {"images": x.cpu().numpy()})[0], "run"))


def _ort_call(fn, what: str):
    try:
        return fn()
    except Exception as exc:  # onnxruntime's own exception types (pybind11), one of several
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ExportCheckError(f"export check failed: onnxruntime cannot {what} the file ({reason}); nothing "
                               f"was written") from None


def _pt2_runner(path: Path):
    import torch

    with warnings.catch_warnings():  # torch 2.11's loader warns about its own read-only buffer
        warnings.filterwarnings("ignore", "The given buffer is not writable", UserWarning)
        module = torch.export.load(str(path)).module()

    def run(x):
        with torch.no_grad():
            return module(x)

    return run


def _describe(diffs: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2g}{UNITS.get(k, '')}" for k, v in diffs.items())


def read_metadata(path: str | Path) -> dict[str, str]:
    """The metadata an exported file carries (`_metadata`; {} for a file LibreYOLO did not write):
    an ONNX file's metadata_props, a pt2 file's libreyolo.json. `names` is JSON text (json.loads
    gives the list)."""
    path = Path(path)
    if path.suffix == FORMATS["pt2"]:  # a zip archive: <archive>/extra/<name>, read without loading the program
        with zipfile.ZipFile(path) as archive:
            member = next((n for n in archive.namelist() if n.split("/", 1)[-1] == f"extra/{META_FILE}"), None)
            return json.loads(archive.read(member)) if member else {}
    import onnx

    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
