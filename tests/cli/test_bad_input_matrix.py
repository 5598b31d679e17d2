"""The bad-input matrix (issue #19): keys, values, dataset yamls, labels, images, checkpoints,
profile files, bench arms and the command line itself.

Every case runs the real CLI entry point in-process (a subprocess costs seconds of torch import;
`test_the_wiring_in_a_real_process` proves a few the slow way) in an empty working directory and
asserts: exit code 2, exactly one line on stderr and it starts with `error: ` and says what the
case expects, no traceback, and nothing new on disk: neither in the working directory nor beside
the inputs. The fixtures are tiny (four 64 px images, one 1-epoch training for the checkpoints),
and no case trains: each is refused by validation before any work starts.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from testkit import make_profile, run_in_process
from torchvision.io import encode_png

NAMES = ["a", "b", "c"]
# epochs=1: should a case not fail, it trains one tiny epoch and fails its assertions, not a long run.
FAST = ["device=cpu", "workers=0", "imgsz=64", "batch=2", "amp=false", "epochs=1"]
FAST_KW = dict(device="cpu", workers=0, imgsz=64, batch=2, amp=False, epochs=1)  # the same, for the Python API


# --- the inputs -------------------------------------------------------------------------------------
def _image(seed: int, h: int = 64, w: int = 64) -> bytes:
    g = torch.Generator().manual_seed(seed)
    img = torch.randint(0, 80, (3, h, w), dtype=torch.uint8, generator=g)
    img[:, 16:48, 16:48] = 200
    return encode_png(img).numpy().tobytes()


def make_dataset(root: Path, n_train: int = 4, n_val: int = 2, names=NAMES) -> Path:
    """A good dataset: n PNGs per split, one box each, and its data.yaml."""
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (root / "images" / split / f"{i}.png").write_bytes(_image(i))
            (root / "labels" / split / f"{i}.txt").write_text(f"{i % len(names)} 0.5 0.5 0.5 0.5\n")
    y = root / "data.yaml"
    y.write_text(json.dumps({"path": str(root), "train": "images/train", "val": "images/val", "names": names}))
    return y


class Inputs:
    """What the cases refer to, made once per module under `root`."""

    def __init__(self, root: Path):
        self.root = root
        self.data = make_dataset(root / "ds")
        self.last = self._train(root)
        self.base = torch.load(self.last, map_location="cpu", weights_only=True)
        self.resumable = self.variant("resumable", lambda c: c["config"].update(epochs=2))
        self.profile = root / "profile.json"
        self.profile.write_text(json.dumps(make_profile()))

    def _train(self, root: Path) -> Path:
        from libreyolo import LibreYOLO

        result = LibreYOLO("yolo9-t").train(data=str(self.data), project=str(root / "runs"), val=False,
                                           **FAST_KW)
        return result.last

    def variant(self, name: str, edit) -> Path:
        """The trained checkpoint edited by `edit(ckpt)`, saved as <root>/<name>/weights/last.pt."""
        ckpt = {k: v for k, v in self.base.items()}
        ckpt["config"] = dict(ckpt["config"])
        edit(ckpt)
        path = self.root / name / "weights" / "last.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(ckpt, path)
        return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, one_thread):
    logger = logging.getLogger("libreyolo")
    saved = logger.handlers[:], logger.propagate, logger.level
    made = Inputs(tmp_path_factory.mktemp("inputs"))
    logger.handlers, logger.propagate, logger.level = saved
    return made


# --- what a case may write: nothing ----------------------------------------------------------------
def tree(*roots: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for root in roots:
        for p in root.rglob("*"):
            st = p.lstat()
            out[str(p)] = (st.st_size, st.st_mtime_ns) if p.is_file() else (-1, 0)
    return out


def assert_one_line_error(code: int, err: str, expected: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert expected in lines[0], lines[0]


# --- the cases ---------------------------------------------------------------------------------------
# (id, argv, the part of the error line it must say, set-up of files in the case's directory or
# None). In argv: {data} the good dataset yaml, {d} the case's directory, {last} the trained
# checkpoint, {resumable} one with an epoch left, {profile} a good profile.json; a set-up returns
# extra names for argv.
def _yaml(text: str):
    return lambda d, i: {"y": _write(d / "data.yaml", text)}


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def _labels(text: str | bytes, split: str = "train"):
    """A copy of the good dataset whose every `split` label file holds `text`."""
    def setup(d, i):
        y = make_dataset(d / "ds")
        for f in (d / "ds" / "labels" / split).glob("*.txt"):
            f.write_bytes(text if isinstance(text, bytes) else text.encode())
        return {"y": y}
    return setup


def _images(content, split: str = "train"):
    """A copy of the good dataset whose every `split` image is replaced by content(good bytes)."""
    def setup(d, i):
        y = make_dataset(d / "ds")
        for f in (d / "ds" / "images" / split).glob("*.png"):
            f.write_bytes(content(f.read_bytes()))
        return {"y": y}
    return setup


def _label_dirs(d, i):
    y = make_dataset(d / "ds")
    for f in (d / "ds" / "labels" / "train").glob("*.txt"):
        f.unlink()
        f.mkdir()
    return {"y": y}


def _dir_images(d, i):
    y = make_dataset(d / "ds")
    for f in (d / "ds" / "images" / "train").glob("*.png"):
        f.unlink()
        (d / "ds" / "images" / "train" / f"{f.stem}.jpg").mkdir()
    return {"y": y}


def _missing_listed(d, i):
    _write(d / "list.txt", "nowhere/0.png\nnowhere/1.png\n")
    return {"y": _write(d / "data.yaml", f"path: {d}\ntrain: list.txt\nval: list.txt\nnames: [a]\n")}


def _a_file(d, i):
    """A file where an output's folder would go, and an image to predict on."""
    _write(d / "f.jpg", b"not a folder")
    return {"img": i.data.parent / "images" / "val" / "0.png"}


def _ckpt(edit):
    return lambda d, i: {"c": i.variant(f"v_{d.name}", edit)}


def _torch_file(obj):
    def setup(d, i):
        torch.save(obj, d / "x.pt")
        return {"c": d / "x.pt"}
    return setup


class _Touch:
    """Pickled code: unpickling it would create the marker file. It must never run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _evil(d, i):
    torch.save({"format": "libreyolo-checkpoint", "schema": 1, "family": "yolo9", "size": "t", "names": NAMES,
                "model": {}, "x": _Touch(d.parent / "pwned")}, d / "evil.pt")
    return {"c": d / "evil.pt"}


def _half(d, i):
    data = i.last.read_bytes()
    return {"c": _write(d / "half.pt", data[: len(data) // 2])}


def _profile(edit):
    def setup(d, i):
        p = make_profile()
        edit(p)
        return {"p": _write(d / "profile.json", json.dumps(p))}
    return setup


def _profile_text(text: str | bytes):
    return lambda d, i: {"p": _write(d / "profile.json", text)}


def _two_class_yaml(d, i):
    return {"y": _write(d / "two.yaml", json.dumps({"path": str(i.data.parent), "train": "images/train",
                                                    "val": "images/val", "names": ["a", "b"]}))}


def _stale_project(d, i):
    (d / "runs" / "train").mkdir(parents=True)
    return {}


T = ["train", "model=yolo9-t", "data={data}"]  # a good train command to spoil with one key
CPU = ["device=cpu", "workers=0", "amp=false", "epochs=1"]
CASES: list[tuple[str, list[str], str, object]] = [
    # keys
    ("unknown key", ["train", "epoch=3"], "unknown key 'epoch' (did you mean 'epochs'?)", None),
    ("unknown --key", ["train", "--epoch", "3"], "unknown key 'epoch' (did you mean 'epochs'?)", None),
    ("unknown --key=v", ["train", "--lr=0.1"], "unknown key 'lr'", None),
    ("key case", ["train", "Epochs=3"], "unknown key 'Epochs'", None),
    ("no value", ["train", "epochs"], "expected key=value, got 'epochs' (did you mean 'epochs=...'?)", None),
    ("no key", ["train", "=3"], "missing key in '=3'", None),
    ("no key --", ["train", "--=3"], "missing key in '--=3'", None),
    ("twice", ["train", "batch=2", "batch=4"], "key 'batch' given twice", None),
    ("twice mixed", ["train", "--batch=2", "batch=4"], "key 'batch' given twice", None),
    ("val train-only key", ["val", "epochs=3"], "key 'epochs' does not apply here", None),
    ("val mosaic", ["val", "mosaic=0.5"], "key 'mosaic' does not apply here", None),
    ("val unknown", ["val", "confidence=0.5"], "unknown key 'confidence'", None),
    ("no model", ["train", "data={data}"], "no model given", None),
    ("no data", ["train", "model=yolo9-t"], "no dataset given", None),
    ("val no model", ["val", "data={data}"], "no model given", None),
    ("val no data", ["val", "model=yolo9-t"], "no dataset given", None),
    ("profile epochs", ["profile", "run", "{data}", "epochs=3"], "'epochs' cannot be set for profile run", None),
    ("profile model", ["profile", "run", "{data}", "model=yolo9-t"], "'model' cannot be set for profile run", None),
    ("profile resume", ["profile", "run", "{data}", "resume=true"], "'resume' cannot be set", None),
    ("profile data as key", ["profile", "run", "imgsz=64", "{data}"], "is a key=value, not a dataset", None),
    ("profile bad size", ["profile", "run", "{data}", "--size", "xl"], "unknown size 'xl' for YOLOv9", None),
    ("profile size clash", ["profile", "run", "{data}", "--weights", "yolo9-t", "--size", "s"],
     "--size s contradicts 'yolo9-t'", None),
    ("bench no model", ["bench", "step", "batch=2"], "no model given", None),
    ("cfg markdown+model", ["cfg", "yolox-t", "--markdown"], "leave out the model", None),
    ("cfg unknown model", ["cfg", "yolox-q"], "unknown model 'yolox-q'", None),
    # values: both spellings of negative numbers, absurd and mistyped values
    ("epochs=0", ["train", "epochs=0"], "bad value for 'epochs': 0", None),
    ("epochs=-1", ["train", "epochs=-1"], "bad value for 'epochs': -1", None),
    ("--epochs=-1", ["train", "--epochs=-1"], "bad value for 'epochs': -1", None),
    ("--epochs -1", ["train", "--epochs", "-1"], "bad value for 'epochs': -1", None),
    ("epochs=1e29", ["train", "epochs=1e29"], "bad value for 'epochs': '1e29' (allowed: int)", None),
    ("epochs huge", ["train", "epochs=100000000000000000000000000000"], "(allowed: int in [1, 100000])", None),
    ("epochs float", ["train", "epochs=2.5"], "bad value for 'epochs': '2.5' (allowed: int)", None),
    ("epochs quoted", ["train", "epochs='3'"], "bad value for 'epochs'", None),
    ("epochs text", ["train", "epochs=ten"], "bad value for 'epochs': 'ten'", None),
    ("batch=-4", ["train", "batch=-4"], "bad value for 'batch': -4", None),
    ("--batch=-4", ["train", "--batch=-4"], "bad value for 'batch': -4", None),
    ("--batch -4", ["train", "--batch", "-4"], "bad value for 'batch': -4", None),
    ("batch=0", ["train", "batch=0"], "bad value for 'batch': 0", None),
    ("batch text", ["train", "batch=abc"], "bad value for 'batch': 'abc' (allowed: int)", None),
    ("bare --batch", ["train", "--batch"], "'--batch' needs a value: batch=VALUE", None),
    ("imgsz=16", ["train", "imgsz=16"], "bad value for 'imgsz': 16", None),
    ("imgsz=100", [*T, "imgsz=100"], "bad value for 'imgsz': 100 (allowed: a multiple of 32)", None),
    ("lr0=nan", ["train", "lr0=nan"], "bad value for 'lr0': 'nan'", None),
    ("lr0=inf", ["train", "lr0=inf"], "bad value for 'lr0': 'inf'", None),
    ("lr0=-0.1", ["train", "--lr0=-0.1"], "bad value for 'lr0': -0.1", None),
    ("mosaic=1.5", ["train", "mosaic=1.5"], "bad value for 'mosaic': 1.5", None),
    ("amp=maybe", ["train", "amp=maybe"], "bad value for 'amp': 'maybe' (allowed: bool)", None),
    ("optimizer=adam", ["train", "optimizer=adam"], "(allowed: auto|sgd|adamw)", None),
    ("amp_dtype", ["train", "amp_dtype=float8"], "(allowed: float16|bfloat16)", None),
    ("cache=maybe", ["train", "cache=maybe"], "(allowed: auto|false|ram|disk)", None),
    ("nbs=0", ["train", "nbs=0"], "bad value for 'nbs': 0", None),
    ("workers=-1", ["train", "--workers=-1"], "bad value for 'workers': -1", None),
    ("save_period=-2", ["train", "--save-period=-2"], "bad value for 'save_period': -2", None),
    ("checkpoint_steps=-1", ["train", "checkpoint_steps=-1"], "bad value for 'checkpoint_steps': -1", None),
    ("patience=-1", ["train", "patience", "-1"], "expected key=value, got 'patience'", None),
    ("conf=2", ["val", "conf=2"], "bad value for 'conf': 2.0", None),
    ("empty name", ["train", "name="], "bad value for 'name': '' (allowed: a folder name, not empty)", None),
    ("--name=", ["train", "--name="], "bad value for 'name': ''", None),
    ("name with /", ["train", "name=a/b"], "bad value for 'name': 'a/b' (allowed: one folder name", None),
    ("name ..", ["train", "name=.."], "bad value for 'name': '..'", None),
    ("empty project", ["train", "project="], "bad value for 'project': ''", None),
    ("device cuda:3", [*T, "device=cuda:3"], "device 'cuda:3'", None),
    ("device 0,1", [*T, "device=0,1"], "torchrun --nproc_per_node 2", None),
    ("unknown model", ["train", "model=foo", "data={data}"], "unknown model 'foo'", None),
    ("unknown size", ["train", "model=yolo9-x", "data={data}"], "unknown model 'yolo9-x'", None),
    ("empty model", ["train", "model=", "data={data}"], "no model given", None),
    ("batch > dataset", [*T, *CPU, "imgsz=64", "batch=5"], "batch=5 is larger than the 4 usable training images of 'data'", None),
    ("batch >> dataset", [*T, *CPU, "imgsz=64", "batch=64", "nbs=16"], "batch=64 is larger than the 4 usable training images", None),
    # dataset yamls
    ("yaml missing", [*T[:2], "data={d}/nope.yaml"], "dataset yaml not found", None),
    ("yaml dashed path", [*T[:2], "--data={d}/my-data.yaml"], "my-data.yaml", None),
    ("builtin unknown", [*T[:2], "data=no_such_dataset"], "unknown dataset 'no_such_dataset'", None),
    ("yaml binary", [*T[:2], "data={y}"], "is not UTF-8 text", lambda d, i: {"y": _write(d / "g.yaml", bytes(range(128, 256)) * 4)}),
    ("yaml empty", [*T[:2], "data={y}"], "must be a mapping", _yaml("")),
    ("yaml a list", [*T[:2], "data={y}"], "must be a mapping", _yaml("[1, 2]\n")),
    ("yaml invalid", [*T[:2], "data={y}"], "is not valid yaml (line", _yaml("train: [unclosed\n")),
    ("yaml python tag", [*T[:2], "data={y}"], "is not valid yaml",
     lambda d, i: {"y": _write(d / "data.yaml", f"x: !!python/object/apply:os.system ['touch {d.parent}/pwned']\n")}),
    ("yaml no names", [*T[:2], "data={y}"], "'names' must be a non-empty list", _yaml("train: a\nval: a\n")),
    ("yaml empty names", [*T[:2], "data={y}"], "'names' must be a non-empty list", _yaml("train: a\nval: a\nnames: []\n")),
    ("yaml names gaps", [*T[:2], "data={y}"], "without gaps", _yaml("train: a\nval: a\nnames: {0: a, 2: b}\n")),
    ("yaml names keys", [*T[:2], "data={y}"], "names keys must be class ids", _yaml("train: a\nval: a\nnames: {x: a}\n")),
    ("yaml nc", [*T[:2], "data={y}"], "nc is 3 but names has 1", _yaml("train: a\nval: a\nnames: [a]\nnc: 3\n")),
    ("yaml no train", [*T[:2], "data={y}"], "'train' is missing", _yaml("val: a\nnames: [a]\n")),
    ("yaml no val", [*T[:2], "data={y}"], "'val' is missing",
     lambda d, i: {"y": _write(d / "data.yaml", f"path: {i.data.parent}\ntrain: images/train\nnames: [a]\n")}),
    ("yaml train absent", [*T[:2], "data={y}"], "train: images not found at", _yaml("train: nowhere\nval: nowhere\nnames: [a]\n")),
    ("yaml train empty", [*T[:2], "data={y}"], "train: no images",
     lambda d, i: (d / "empty").mkdir() or {"y": _write(d / "data.yaml", "train: empty\nval: empty\nnames: [a]\n")}),
    ("yaml builtin", [*T[:2], "data={y}"], "unknown builtin 'cats'", _yaml("builtin: cats\ntrain: a\nval: a\nnames: [a]\n")),
    ("yaml sha256", [*T[:2], "data={y}"], "sha256 must be 64 hex digits", _yaml("sha256: abc\ntrain: a\nval: a\nnames: [a]\n")),
    ("image list binary", [*T[:2], "data={y}"], "train image list", lambda d, i: {
        "l": _write(d / "list.txt", b"\xff\xfe\x00\x81" * 8),
        "y": _write(d / "data.yaml", "train: list.txt\nval: list.txt\nnames: [a]\n")}),
    # labels: the error names the first files and the defect
    ("label class id", [*T[:2], "data={y}", *FAST], "0.txt: line 1: class id 7 out of range (the dataset has 3 classes",
     _labels("7 0.5 0.5 0.1 0.1\n")),
    ("label negative class", [*T[:2], "data={y}", *FAST], "class id -1 out of range", _labels("-1 0.5 0.5 0.1 0.1\n")),
    ("label float class", [*T[:2], "data={y}", *FAST], "class id 1.5 is not an integer", _labels("1.5 0.5 0.5 0.1 0.1\n")),
    ("label nan", [*T[:2], "data={y}", *FAST], "line 2: 'nan' is not a finite number",
     _labels("0 0.5 0.5 0.1 0.1\n0 nan 0.5 0.1 0.1\n")),
    ("label inf", [*T[:2], "data={y}", *FAST], "'inf' is not a finite number", _labels("0 0.5 inf 0.1 0.1\n")),
    ("label 4 columns", [*T[:2], "data={y}", *FAST], "line 1: 4 columns, expected 5 (class cx cy w h)", _labels("0 0.5 0.5 0.1\n")),
    ("label 6 columns", [*T[:2], "data={y}", *FAST], "6 columns, expected 5", _labels("0 0.5 0.5 0.1 0.1 0.9\n")),
    ("label text", [*T[:2], "data={y}", *FAST], "'abc' is not a number", _labels("0 abc 0.5 0.1 0.1\n")),
    ("label outside", [*T[:2], "data={y}", *FAST], "coordinates outside [0, 1]", _labels("0 1.5 0.5 0.1 0.1\n")),
    ("label zero size", [*T[:2], "data={y}", *FAST], "box width and height must be > 0", _labels("0 0.5 0.5 0 0.1\n")),
    ("label binary", [*T[:2], "data={y}", *FAST], "not UTF-8 text", _labels(b"\xff\xfe\x00\x81 garbage")),
    ("label a folder", [*T[:2], "data={y}", *FAST], "not a file", _label_dirs),
    ("label counts", [*T[:2], "data={y}", *FAST], "(4 found, all skipped: 4 corrupt labels; 0.txt: line 1: class id 9",
     _labels("9 0.5 0.5 0.1 0.1\n")),
    ("label more", [*T[:2], "data={y}", *FAST], "; and 1 more; in ", _labels("9 0.5 0.5 0.1 0.1\n")),
    ("val labels", [*T[:2], "data={y}", *FAST, "val=true"], "val: no usable images (2 found", _labels("5 0.5 0.5 0.1 0.1\n", "val")),
    # images
    ("image garbage", [*T[:2], "data={y}", *FAST], "train: no usable images (4 found, all skipped: 4 unreadable images",
     _images(lambda b: b"not an image at all")),
    ("image empty", [*T[:2], "data={y}", *FAST], "4 unreadable images", _images(lambda b: b"")),
    ("image pixels cut", [*T[:2], "data={y}", *FAST], "0.png: does not decode (corrupt image data)",
     _images(lambda b: b[: len(b) // 2])),
    ("image body garbage", [*T[:2], "data={y}", *FAST], "does not decode",
     _images(lambda b: b[:40] + bytes(range(256)) * 4)),
    ("image zero size", [*T[:2], "data={y}", *FAST], "zero image size",
     _images(lambda b: b[:16] + b"\x00" * 8 + b[24:])),
    ("image folders", [*T[:2], "data={y}", *FAST], "unreadable image (IsADirectoryError)", _dir_images),
    ("image list missing", [*T[:2], "data={y}", *FAST], "unreadable image (FileNotFoundError)", _missing_listed),
    ("val images", [*T[:2], "data={y}", *FAST, "val=true"], "val: no usable images (2 found",
     _images(lambda b: b[: len(b) // 2], "val")),
    # checkpoints
    ("ckpt missing", ["train", "model={d}/missing.pt", "data={data}"], "weights file", None),
    ("ckpt text", ["train", "model={c}", "data={data}"], "(a text file: PyTorch checkpoints are zip archives)",
     lambda d, i: {"c": _write(d / "notes.pt", "these are not weights\n" * 9)}),
    ("ckpt bytes", ["train", "model={c}", "data={data}"], "(not a PyTorch file",
     lambda d, i: {"c": _write(d / "noise.pt", bytes(range(256)))}),
    ("ckpt empty", ["train", "model={c}", "data={data}"], "the file is empty", lambda d, i: {"c": _write(d / "e.pt", b"")}),
    ("ckpt truncated", ["train", "model={c}", "data={data}"], "is not a readable checkpoint (truncated or corrupt", _half),
    ("ckpt foreign", ["val", "model={c}", "data={data}"], "not a LibreYOLO checkpoint (foreign file)",
     _torch_file({"state_dict": {"w": torch.zeros(2)}})),
    ("ckpt tensor", ["train", "model={c}", "data={data}"], "(foreign file)", _torch_file(torch.zeros(3))),
    ("ckpt pickled code", ["train", "model={c}", "data={data}"], "is not a LibreYOLO checkpoint (UnpicklingError)", _evil),
    ("ckpt newer", ["train", "model={c}", "data={data}"], "has checkpoint schema 99", _ckpt(lambda c: c.update(schema=99))),
    ("ckpt no names", ["train", "model={c}", "data={data}"], "is missing 'names'", _ckpt(lambda c: c.pop("names"))),
    ("ckpt names str", ["train", "model={c}", "data={data}"], "its 'names' is a str, not a list",
     _ckpt(lambda c: c.update(names="abc"))),
    ("ckpt family", ["train", "model={c}", "data={data}"], "unknown family 'yolo99'", _ckpt(lambda c: c.update(family="yolo99"))),
    ("ckpt size", ["train", "model={c}", "data={data}"], "names size 'q' unknown", _ckpt(lambda c: c.update(size="q"))),
    ("val classes", ["val", "model={last}", "data={y}", "device=cpu", "workers=0", "imgsz=64"], "model was trained on 3 classes", _two_class_yaml),
    ("val trained data gone", ["val", "model={c}", "device=cpu", "workers=0"],
     "dataset yaml not found: gone/data.yaml (the dataset", _ckpt(lambda c: c["config"].update(data="gone/data.yaml"))),
    ("resume missing", ["train", "resume={d}/gone.pt"], "does not exist", None),
    ("resume=true none", ["train", "model=yolo9-t", "resume=true"], "resume=true but no last.pt", _stale_project),
    ("resume weights only", ["train", "resume={c}"], "cannot be resumed: its 'optimizer' is missing",
     _ckpt(lambda c: c.pop("optimizer"))),
    ("resume other family", ["train", "resume={resumable}", "model=yolox-t"],
     "is a yolo9-t checkpoint but model=yolox-t is yolox-t", None),
    ("resume other size", ["train", "resume={resumable}", "model=yolo9-s"], "but model=yolo9-s is yolo9-s", None),
    ("resume weights misfit", ["train", "resume={c}"], "its model weights do not fit yolo9-t with 3 classes",
     _ckpt(lambda c: (c["config"].update(epochs=2), c.update(model={**c["model"], next(iter(c["model"])): torch.zeros(1)})))),
    ("resume weights missing", ["train", "resume={c}"], "1 missing",
     _ckpt(lambda c: (c["config"].update(epochs=2), c.update(model=dict(list(c["model"].items())[1:]))))),
    ("resume class count", ["train", "resume={c}"], "it was trained on 3 classes but dataset 'two' has 2",
     lambda d, i: {"c": i.variant(f"v_{d.name}", lambda c: c["config"].update(epochs=2, data=str(_two_class_yaml(d, i)["y"])))}),
    ("resume finished", ["train", "resume={last}"], "finished all 1 epochs; nothing to resume", None),
    ("resume change", ["train", "resume={resumable}", "epochs=5"], "cannot change epochs when resuming", None),
    ("resume damaged", ["train", "resume={c}"], "the checkpoint's training state is damaged",
     _ckpt(lambda c: (c["config"].update(epochs=2), c.update(rng={"python": 1})))),
    ("resume bad config", ["train", "resume={c}"], "bad value for 'lr0'",
     _ckpt(lambda c: c["config"].update(epochs=2, lr0="fast"))),
    ("resume epoch str", ["train", "resume={c}"], "its 'epoch' is a str, not an int", _ckpt(lambda c: c.update(epoch="0"))),
    # profile files
    ("profile none", ["profile", "summary", "{d}"], "no profile at", None),
    ("profile malformed", ["profile", "summary", "{p}"], "is not valid JSON", _profile_text("{oops")),
    ("profile truncated", ["profile", "phases", "{p}"], "is not valid JSON (truncated or corrupt?)",
     lambda d, i: {"p": _write(d / "profile.json", i.profile.read_text()[:300])}),
    ("profile binary", ["profile", "kernels", "{p}"], "cannot read", _profile_text(b"\xff\xfe\x00garbage")),
    ("profile foreign", ["profile", "summary", "{p}"], "is not a LibreYOLO profile", _profile_text('{"traceEvents": []}')),
    ("profile list", ["profile", "summary", "{p}"], "is not a LibreYOLO profile", _profile_text("[1, 2]")),
    ("profile summary file", ["profile", "summary", "{p}"], "is a profile summary",
     _profile_text('{"schema": "libreyolo-profile-summary"}')),
    ("profile newer", ["profile", "kernels", "{p}"], "uses profile schema version 99", _profile(lambda p: p.update(schema_version=99))),
    ("profile version str", ["profile", "summary", "{p}"], "invalid schema_version", _profile(lambda p: p.update(schema_version="1"))),
    ("profile no verdict", ["profile", "summary", "{p}"], "missing or malformed verdict", _profile(lambda p: p.pop("verdict"))),
    ("profile headline type", ["profile", "summary", "{p}"], 'headline.step_ms_mean is "fast", not a number or null',
     _profile(lambda p: p["headline"].update(step_ms_mean="fast"))),
    ("profile row name", ["profile", "kernels", "{p}"], "kernels.rows[0].name is missing",
     _profile(lambda p: p["kernels"]["rows"][0].pop("name"))),
    ("profile row share", ["profile", "kernels", "{p}", "--json"], "kernels.rows[1].share is null",
     _profile(lambda p: p["kernels"]["rows"][1].update(share=None))),
    ("profile phase type", ["profile", "phases", "{p}"], "phases[0].host_ms is \"1\", not a number or null",
     _profile(lambda p: p["phases"][0].update(host_ms="1"))),
    ("profile phase row", ["profile", "phases", "{p}", "--json"], "phases[3] is 3, not an object",
     _profile(lambda p: p["phases"].__setitem__(3, 3))),
    ("profile verdict type", ["profile", "summary", "{p}", "--json"], "verdict.lever is null, not a string",
     _profile(lambda p: p["verdict"].update(lever=None))),
    ("profile graph type", ["profile", "summary", "{p}"], "run.cuda_graph is \"on\"", _profile(lambda p: p["run"].update(cuda_graph="on"))),
    ("profile note type", ["profile", "summary", "{p}"], "overhead.note is [], not a string",
     _profile(lambda p: p["overhead"].update(fraction=None, note=[]))),
    # bench arms
    ("arms empty", ["bench", "step", "model=yolo9-t", "arms="], "no arms given", None),
    ("--arms empty", ["bench", "step", "model=yolo9-t", "--arms", ""], "no arms given", None),
    ("arms commas", ["bench", "step", "model=yolo9-t", "arms=,"], "no arms given", None),
    ("arms stray comma", ["bench", "step", "model=yolo9-t", "arms=float16,,bfloat16"], "empty arm in arms='float16,,bfloat16'", None),
    ("arms unknown", ["bench", "step", "model=yolo9-t", "arms=float8"], "unknown arm 'float8'", None),
    ("arms unknown part", ["bench", "step", "model=yolo9-t", "arms=float16+nope"], "unknown arm 'float16+nope'", None),
    ("bench batch > data", ["bench", "step", "model=yolo9-t", "data={data}", "batch=8", "device=cpu"],
     "batch=8 is larger than the 4 usable training images", None),
    # outputs that no write could make: refused before the work, not a traceback after it
    ("save-json under a file", ["val", "model={last}", "data={data}", "--save-json", "{d}/f.jpg/x.json", *FAST[:4]],
     "f.jpg is a file, not a folder", _a_file),
    ("save-json a folder", ["val", "model={last}", "data={data}", "--save-json", ".", *FAST[:4]],
     "it is a folder; name a file", None),
    ("export under a file", ["export", "model={last}", "output={d}/f.jpg/x.onnx"], "f.jpg is a file, not a folder",
     _a_file),
    ("data check under a file", ["data", "check", "data={data}", "out={d}/f.jpg/x.html"],
     "f.jpg is a file, not a folder", _a_file),
    ("data check a folder", ["data", "check", "data={data}", "out=."], "it is a folder; name a file", None),
    ("project a file", [*T, "project={d}/f.jpg", *FAST], "cannot use the project folder",
     _a_file),
    ("predict project a file", ["predict", "model={last}", "source={img}", "project={d}/f.jpg", "device=cpu"],
     "f.jpg is a file, not a folder", _a_file),
    ("cfg json and markdown", ["cfg", "--json", "--markdown"], "--json and --markdown", None),
    ("data check key", ["data", "check", "data={data}", "foo=1"], "unknown key 'foo' (allowed: data, imgsz, out)", None),
    # the command line's own errors: one line, not four of usage
    ("steps=0", ["bench", "step", "model=yolo9-t", "--steps", "0"], "invalid value for '--steps'", None),
    ("warmup=0", ["bench", "step", "model=yolo9-t", "--warmup", "0"], "invalid value for '--warmup'", None),
    ("repeat=0", ["profile", "run", "{data}", "--repeat", "0"], "invalid value for '--repeat'", None),
    ("repeat text", ["profile", "run", "{data}", "--repeat", "x"], "invalid value for '--repeat'", None),
    ("top=0", ["profile", "kernels", "{profile}", "--top", "0"], "invalid value for '--top'", None),
    ("missing PATH", ["profile", "summary"], "missing argument 'PATH' (see 'libreyolo profile summary --help')", None),
    ("missing DATA", ["profile", "run"], "missing argument 'DATA'", None),
    ("no such command", ["tarin"], "no such command 'tarin'", None),
    ("no such option", ["--bogus"], "no such option: --bogus", None),
    ("profile option", ["profile", "summary", "{profile}", "--bogus"], "no such option: --bogus", None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, inputs, tmp_path, monkeypatch, capsys):
    _, argv, expected, setup = case
    work = tmp_path / "work"
    work.mkdir()
    names = {"data": inputs.data, "d": work, "last": inputs.last, "resumable": inputs.resumable,
             "profile": inputs.profile}
    names.update(setup(work, inputs) if setup is not None else {})
    monkeypatch.chdir(work)
    monkeypatch.delenv("LIBREYOLO_DEBUG", raising=False)
    before = tree(tmp_path, inputs.root)
    code, _, err = run_in_process([a.format(**names) for a in argv], capsys)
    assert_one_line_error(code, err, expected)
    assert tree(tmp_path, inputs.root) == before, "a failed command wrote to disk"
    assert not (tmp_path / "pwned").exists(), "code from an input ran"


def test_the_matrix_covers_every_group():
    assert len(CASES) >= 100
    assert len({c[0] for c in CASES}) == len(CASES)


# --- failures after the run started --------------------------------------------------------------------
def test_out_of_memory_at_the_first_step_is_one_line_and_leaves_no_run_dir(inputs, tmp_path, monkeypatch, capsys):
    from libreyolo.engine import trainer

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(trainer, "train_step", oom)
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path, inputs.root)
    code, _, err = run_in_process(["train", "model=yolo9-t", f"data={inputs.data}", *FAST, "val=false"], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    # Training had started, so its log lines come first; the error is the one last line.
    assert code == 2 and "Traceback" not in err, err
    assert [ln for ln in lines if ln.startswith("error: ")] == [lines[-1]]
    assert lines[-1] == "error: out of memory on cpu at batch=2 imgsz=64: lower batch (e.g. batch=1) or imgsz"
    assert tree(tmp_path, inputs.root) == before, "the run directory of a failed run must go"


def test_cpu_allocator_failure_is_the_same_one_line(monkeypatch):
    from libreyolo.config import build_config
    from libreyolo.engine.device import OutOfMemory, out_of_memory_as_error

    cfg = build_config({"batch": 1, "imgsz": 4096})
    with pytest.raises(OutOfMemory, match=r"^out of memory on cpu at batch=1 imgsz=4096: lower imgsz$"):
        with out_of_memory_as_error(cfg, torch.device("cpu")):
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can't allocate memory: "
                               "you tried to allocate 1000000000000 bytes")
    with pytest.raises(RuntimeError, match="shape mismatch"):  # any other error passes through untouched
        with out_of_memory_as_error(cfg, torch.device("cpu")):
            raise RuntimeError("shape mismatch")


def test_a_resume_removes_the_temp_files_of_a_killed_checkpoint_write(inputs, tmp_path, caplog):
    """A kill -9 during torch.save leaves `.last.pt.*.tmp` beside last.pt; the resume cleans it."""
    import shutil

    from libreyolo import LibreYOLO

    run = tmp_path / "run"
    shutil.copytree(inputs.resumable.parent.parent, run)
    stale = run / "weights" / ".last.pt.k1ll3d.tmp"
    stale.write_bytes(b"PK\x03\x04 half a checkpoint")
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        result = LibreYOLO(str(run / "weights" / "last.pt")).train(resume=str(run / "weights" / "last.pt"))
    assert result.epochs_run == 1 and not stale.exists()
    assert f"removed {stale}, left by an interrupted checkpoint write" in caplog.text
    assert sorted(p.name for p in (run / "weights").iterdir()) == ["last.pt"]


def test_nbs_below_batch_is_said_in_one_line(inputs, tmp_path, caplog):
    from libreyolo import LibreYOLO

    with caplog.at_level(logging.INFO, logger="libreyolo"):
        LibreYOLO("yolo9-t").train(data=str(inputs.data), project=str(tmp_path), val=False, nbs=2,
                                   **{**FAST_KW, "batch": 4})
    assert ("nbs=2 is below batch=4: no gradient accumulation (one optimizer step per batch) and weight decay "
            "scaled by batch/nbs = 2") in caplog.text


# --- the wiring, in a real process ----------------------------------------------------------------------
WIRED = [
    (["train", "--epochs=-1"], "bad value for 'epochs': -1"),
    (["bench", "step", "model=yolo9-t", "arms="], "no arms given"),
    (["profile", "kernels", "{profile}", "--top", "0"], "invalid value for '--top'"),
    (["train", "model=yolo9-t", "data={y}"], "is not UTF-8 text"),
]


def test_the_wiring_in_a_real_process(cli, inputs, tmp_path):
    garbage = _write(tmp_path / "g.yaml", bytes(range(128, 256)))
    for argv, expected in WIRED:
        result = cli(*(a.format(profile=inputs.profile, y=garbage) for a in argv))
        assert_one_line_error(result.returncode, result.stderr, expected)
        assert not result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.yaml"]


def test_debug_still_shows_the_traceback(cli):
    result = cli("train", "--epochs=-1", env={"LIBREYOLO_DEBUG": "1"})
    assert result.returncode != 0 and "Traceback" in result.stderr

