"""predict/sources.py: every source form becomes RGB uint8 Frames (names, frame numbers, running
index), video through PyAV with vid_stride, and every unusable source is one DataError line
before anything is decoded (a bad file inside a folder is skipped with a warning instead)."""

import logging
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import encode_jpeg, encode_png

from libreyolo.errors import ConfigError, DataError
from libreyolo.predict.sources import Frame, open_source

COLORS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30), (30, 200, 200)]


def write_image(path: Path, color=(10, 20, 30), h: int = 6, w: int = 8) -> Path:
    img = torch.tensor(color, dtype=torch.uint8).view(3, 1, 1).expand(3, h, w).contiguous()
    data = encode_png(img) if path.suffix == ".png" else encode_jpeg(img, quality=100)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.numpy().tobytes())
    return path


def write_video(path: Path, n: int = 5, w: int = 64, h: int = 48, fps: int = 10) -> Path:
    """n solid frames, frame i in COLORS[i % 5]."""
    with av.open(str(path), mode="w") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for i in range(n):
            rgb = np.empty((h, w, 3), np.uint8)
            rgb[:] = COLORS[i % len(COLORS)]
            out.mux(stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
        out.mux(stream.encode(None))
    return path


def one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text
    return text


def test_an_image_file(tmp_path):
    path = write_image(tmp_path / "a.png", (10, 20, 30))
    source = open_source(path)
    assert (source.kind, source.total, len(source), source.fps) == ("image", 1, 1, None)
    (f,) = list(source)
    assert (f.name, f.path, f.frame, f.index, f.fps) == ("a.png", str(path), None, 0, None)
    assert f.image.dtype == torch.uint8 and f.image.shape == (3, 6, 8) and f.image.is_contiguous()
    assert f.image[:, 0, 0].tolist() == [10, 20, 30]  # RGB order
    assert [g.name for g in open_source(str(path))] == ["a.png"]  # a str as well as a Path


def test_a_folder_is_its_images_sorted_by_name_without_subfolders_or_hidden_files(tmp_path):
    for name in ("b.png", "a.JPG", "c.jpeg", ".hidden.png", "sub/d.png"):
        write_image(tmp_path / name)
    (tmp_path / "notes.txt").write_text("not an image")
    source = open_source(tmp_path)
    assert source.kind == "folder" and source.total == 3
    frames = list(source)
    assert [f.name for f in frames] == ["a.JPG", "b.png", "c.jpeg"]
    assert [f.index for f in frames] == [0, 1, 2]


def test_a_glob_is_the_images_it_matches_sorted(tmp_path):
    for name in ("x2.png", "x1.png", "y.png", "x3.txt"):
        write_image(tmp_path / name)
    source = open_source(str(tmp_path / "x*"))
    assert source.kind == "glob"
    assert [f.name for f in source] == ["x1.png", "x2.png"]


def test_a_video_frame_by_frame_and_with_vid_stride(tmp_path):
    path = write_video(tmp_path / "clip.mp4", n=5, fps=10)
    source = open_source(path)
    assert (source.kind, source.total, source.fps) == ("video", 5, 10.0)
    frames = list(source)
    assert [(f.frame, f.index) for f in frames] == [(i, i) for i in range(5)]
    assert all(f.name == "clip.mp4" and f.path == str(path) and f.fps == 10.0 for f in frames)
    for f in frames:
        assert f.image.shape == (3, 48, 64) and f.image.dtype == torch.uint8 and f.image.is_contiguous()
        mean = f.image.float().mean((1, 2))  # yuv420p round trip: colours roughly kept
        assert (mean - torch.tensor(COLORS[f.frame], dtype=torch.float)).abs().max() < 12
    strided = open_source(path, vid_stride=2)
    assert (strided.total, strided.fps) == (3, 5.0)
    assert [(f.frame, f.index) for f in strided] == [(0, 0), (2, 1), (4, 2)]


def test_in_memory_images_are_rgb(tmp_path):
    rgb = np.zeros((4, 5, 3), np.uint8)
    rgb[..., 0] = 255  # red
    gray = np.full((4, 5), 7, np.uint8)
    chw = torch.zeros(3, 4, 5, dtype=torch.uint8)
    floats = torch.full((1, 4, 5), 1.0)
    pil = Image.new("RGBA", (5, 4), (1, 2, 3, 4))
    expected = [[255, 0, 0], [7, 7, 7], [0, 0, 0], [255, 255, 255], [1, 2, 3]]
    for value, pixel in zip([rgb, gray, chw, floats, pil], expected):
        source = open_source(value)
        assert source.kind == "array" and source.total == 1
        (f,) = list(source)
        assert (f.name, f.path, f.frame) == ("image0", None, None)
        assert f.image.shape == (3, 4, 5) and f.image.dtype == torch.uint8 and f.image.is_contiguous()
        assert f.image[:, 0, 0].tolist() == pixel
    assert next(iter(open_source(rgb))).image.data_ptr() != torch.from_numpy(rgb).data_ptr()  # a copy


def test_a_list_mixes_forms_with_a_running_index(tmp_path):
    image = write_image(tmp_path / "a.png")
    video = write_video(tmp_path / "v.mp4", n=3)
    source = open_source([image, np.zeros((4, 5, 3), np.uint8), str(video), (tmp_path / "*.png").as_posix()])
    assert source.kind == "list" and source.total == 6
    frames = list(source)
    assert [(f.name, f.frame, f.index) for f in frames] == [
        ("a.png", None, 0), ("image1", None, 1), ("v.mp4", 0, 2), ("v.mp4", 1, 3), ("v.mp4", 2, 4),
        ("a.png", None, 5)]
    assert all(isinstance(f, Frame) for f in frames)


def test_undecodable_files_in_a_folder_are_skipped_with_a_warning(tmp_path, caplog):
    write_image(tmp_path / "a.png")
    (tmp_path / "b.jpg").write_bytes(b"not a jpeg")
    write_image(tmp_path / "c.png")
    source = open_source(tmp_path)
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        assert [f.name for f in source] == ["a.png", "c.png"]
    assert source.skipped == 1
    assert [r.getMessage() for r in caplog.records] == [f"cannot decode {tmp_path / 'b.jpg'} "
                                                        "(truncated or not an image); skipped"]


@pytest.mark.parametrize("make, expect", [
    (lambda d: d / "missing.jpg", "source not found"),
    (lambda d: d / "empty", "no images (.jpg, .jpeg, .png, .webp) in folder"),
    (lambda d: str(d / "*.gif"), "no images (.jpg, .jpeg, .png, .webp) match"),
    (lambda d: d / "doc.gif", "unsupported file type '.gif'"),
    (lambda d: d / "bad.mp4", "cannot read video"),
    (lambda d: "https://example.com/a.jpg", "download the file"),
    (lambda d: [], "empty list"),
    (lambda d: [[d / "doc.gif"]], "is itself a list"),
    (lambda d: np.zeros((4, 5, 3), np.float32), "shape (4, 5, 3) and dtype float32"),
    (lambda d: np.zeros((4, 5, 4), np.uint8), "shape (4, 5, 4)"),
    (lambda d: np.zeros((0, 5, 3), np.uint8), "shape (0, 5, 3)"),
    (lambda d: torch.zeros(2, 3, 4, 5), "(a batch: pass list(tensor))"),
    (lambda d: torch.zeros(4, 5, 3, dtype=torch.uint8), "shape (4, 5, 3)"),
    (lambda d: torch.full((3, 4, 5), 255.0), "float images must be in [0, 1]"),
    (lambda d: torch.zeros(3, 4, 5, dtype=torch.bool), "dtype torch.bool"),
    (lambda d: 3, "type int"),
])
def test_unusable_sources_are_one_line_before_decoding(tmp_path, make, expect):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "clip.txt").write_text("x")
    (tmp_path / "doc.gif").write_bytes(b"GIF89a")
    (tmp_path / "bad.mp4").write_bytes(b"not a video" * 50)
    with pytest.raises(DataError) as exc:
        open_source(make(tmp_path))
    assert expect in one_line(exc)


def test_a_lone_image_that_does_not_decode_names_the_file(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"truncated")
    with pytest.raises(DataError) as exc:  # checked at open, before a model is built
        open_source(tmp_path / "a.jpg")
    assert "a.jpg: does not decode" in one_line(exc)


def test_a_truncated_video_is_one_line(tmp_path):
    data = write_video(tmp_path / "clip.mp4").read_bytes()
    (tmp_path / "cut.mp4").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError) as exc:
        list(open_source(tmp_path / "cut.mp4"))
    assert "cut.mp4" in one_line(exc)


def test_video_without_pyav_says_how_to_install_it(tmp_path, monkeypatch):
    path = write_video(tmp_path / "clip.mp4")
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` raises ImportError
    with pytest.raises(DataError) as exc:
        open_source(path)
    assert one_line(exc) == "reading video needs PyAV: pip install 'libreyolo[video]'"


def test_a_bad_list_entry_is_named(tmp_path):
    with pytest.raises(DataError) as exc:
        open_source([np.zeros((4, 5, 3), np.uint8), np.zeros((4, 5), np.int64)])
    assert one_line(exc).startswith("source list entry 1: numpy array of shape (4, 5) and dtype int64")


@pytest.mark.parametrize("stride", [0, -1, 1.5, True])
def test_vid_stride_is_a_whole_number_from_1(tmp_path, stride):
    with pytest.raises(ConfigError) as exc:
        open_source(np.zeros((4, 5, 3), np.uint8), vid_stride=stride)
    assert "vid_stride" in one_line(exc)
