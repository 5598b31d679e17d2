"""`libreyolo predict`: the real command on a folder (--json lines, annotated files), then through
its entry point in this process a video and a classifier's image; every bad input is one line,
exit code 2, nothing written."""

import json
from pathlib import Path

import pytest
import torch
from testkit import run_in_process
from torchvision.io import write_png

from libreyolo.families import REGISTRY, arch_name

FAST = ["imgsz=64", "device=cpu", "workers=1"]
CLASSIFIER = next(arch_name(s, s.sizes[0]) for s in REGISTRY.values() if "classify" in s.tasks)


def _images(folder: Path, n: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    for i in range(n):
        write_png(torch.randint(0, 256, (3, 40 + 8 * i, 60), generator=gen, dtype=torch.uint8), str(folder / f"{i}.png"))
    return folder


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_a_folder_to_json_lines_and_annotated_images(cli, tmp_path, monkeypatch, capsys):
    _images(tmp_path / "imgs")
    r = cli("predict", "model=yolo9-t", "source=imgs", "conf=0.0", "max_det=5", "batch=2", *FAST, "--json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [d["source"] for d in lines] == ["0.png", "1.png", "2.png"]
    for k, d in enumerate(lines):
        assert (d["width"], d["height"]) == (60, 40 + 8 * k) and d["task"] == "detect"
        assert len(d["detections"]) == 5 and {"box", "score", "class", "name"} <= set(d["detections"][0])
        assert Path(tmp_path / d["saved"]).is_file()
    assert _files(tmp_path / "runs" / "predict") == {"exp", "exp/0.png", "exp/1.png", "exp/2.png"}
    assert "random weights" in r.stderr and "done: 3 images" in r.stderr
    # The command's entry point in this process (no interpreter and torch start-up), as the other
    # predict tests below; the run above is the real process.
    monkeypatch.chdir(tmp_path)
    code, out, err = run_in_process(["predict", "model=yolo9-t", "source=imgs/1.png", "save=false", *FAST], capsys)
    assert code == 0 and out.startswith("1.png: ") and "exp2" not in _files(tmp_path / "runs"), err


def test_a_video_frame_by_frame_into_an_annotated_video(tmp_path, monkeypatch, capsys):
    av = pytest.importorskip("av")
    path = tmp_path / "clip.mp4"
    with av.open(str(path), mode="w") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(4):
            frame = av.VideoFrame.from_ndarray(torch.full((48, 64, 3), 40 * i, dtype=torch.uint8).numpy(), format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    monkeypatch.chdir(tmp_path)
    code, out, err = run_in_process(["predict", "model=yolo9-t", "source=clip.mp4", "vid_stride=2", *FAST, "--json"],
                                    capsys)
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [d["frame"] for d in lines] == [0, 2] and {d["source"] for d in lines} == {"clip.mp4"}
    saved = tmp_path / lines[0]["saved"]
    with av.open(str(saved)) as video:
        assert sum(1 for _ in video.decode(video=0)) == 2


def test_a_classifier_prints_its_top_classes(tmp_path, monkeypatch, capsys):
    _images(tmp_path / "imgs", 1)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_in_process(["predict", f"model={CLASSIFIER}", "source=imgs/0.png", "save=false", *FAST,
                                     "--json"], capsys)
    assert code == 0, err
    (line,) = [json.loads(x) for x in out.splitlines()]
    assert line["task"] == "classify" and len(line["top"]) == 5 and line["class"] == line["top"][0]["class"]


@pytest.mark.parametrize("args, said", [
    (["model=yolo9-t"], "no source given"),
    (["source=x.png"], "no model given"),
    (["model=yolo9-t", "source=missing.png"], "source 'missing.png' does not exist"),
    (["model=missing.pt", "source=imgs"], "weights file 'missing.pt' does not exist"),
    (["model=yolo9-t", "source=imgs", "conf=2"], "bad value for 'conf'"),
    (["model=yolo9-t", "source=imgs", "epochs=3"], "key 'epochs' does not apply here"),
    (["model=yolo9-t", "source=imgs", "save=maybe"], "bad value for 'save'"),
    (["model=yolo9-t", "source=broken.png", *FAST], "broken.png"),
    (["model=yolo9-t", "source=notes.txt", *FAST], "notes.txt"),
    (["model=yolo9-t", "source=imgs", "device=0,1"], "one device"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, args, said):
    """In this process (the entry point the command runs); test_a_missing_source_in_a_real_process
    covers the process itself."""
    monkeypatch.chdir(tmp_path)
    _images(tmp_path / "imgs", 1)
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (tmp_path / "notes.txt").write_text("hello")
    before = _files(tmp_path)
    code, out, err = run_in_process(["predict", *args], capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and said in err, err
    assert "Traceback" not in err and out == ""
    assert _files(tmp_path) == before


def test_a_missing_source_in_a_real_process(cli, tmp_path):
    r = cli("predict", "model=yolo9-t", "source=missing.png")
    assert r.returncode == 2 and r.stderr == "error: source 'missing.png' does not exist\n" and r.stdout == ""
    assert _files(tmp_path) == set()


def test_help_explains_sources_and_output(cli):
    r = cli("predict", "--help")
    assert r.returncode == 0
    for word in ("source=", "--json", "glob", "video", "conf=", "cuda_graph=", "runs/predict"):
        assert word in r.stdout
