"""predict/draw.py: annotate draws boxes (class colours) or the top classes on a copy of the image;
Saver names files like their inputs without overwriting, creates the run folder with its first
file, writes a video as one readable mp4, and leaves no file under a final name when interrupted."""

from pathlib import Path

import av
import numpy as np
import pytest
import torch
from torchvision.io import decode_image

from libreyolo.predict import draw
from libreyolo.predict.draw import PALETTE, Saver, annotate, predict_dir
from libreyolo.predict.results import Result
from libreyolo.predict.sources import Frame, open_source

NAMES = ["cat", "dog", "bird"]


def grey(h: int = 48, w: int = 64) -> torch.Tensor:
    return torch.full((3, h, w), 100, dtype=torch.uint8)


def detection(boxes, classes, h: int = 48, w: int = 64) -> Result:
    n = len(boxes)
    return Result("a.jpg", "a.jpg", None, (h, w), NAMES, "detect",
                  boxes=torch.tensor(boxes, dtype=torch.float32).view(n, 4),
                  scores=torch.linspace(0.9, 0.5, n), classes=torch.tensor(classes, dtype=torch.int64))


def still(name: str, index: int, path: str | None = None) -> Frame:
    return Frame(grey(), name, path, None, index)


def video_frames(name: str, n: int, h: int = 48, w: int = 64, fps: float = 10.0):
    return [Frame(grey(h, w), name, f"/videos/{name}", i, i, fps) for i in range(n)]


def read_video(path: Path) -> tuple[int, str, tuple[int, int], float]:
    with av.open(str(path)) as f:
        stream = f.streams.video[0]
        frames = sum(1 for _ in f.decode(stream))
        return frames, stream.codec_context.name, (stream.height, stream.width), float(stream.average_rate)


def test_boxes_are_drawn_in_their_class_colour_on_a_copy():
    image = grey()
    out = annotate(image, detection([[8, 8, 56, 44]], [1]), line_width=2)
    assert out.shape == image.shape and out.dtype == torch.uint8
    assert (image == 100).all()  # the input is not drawn on
    assert out[:, 38, 8].tolist() == list(PALETTE[1])  # the left edge, below the label
    assert (out[:, 38, 30] == 100).all()  # inside the box, below the label
    changed = (out != image).any(0)
    assert not changed[:6].any() and not changed[:, 59:].any() and not changed[47:].any()


def test_boxes_past_the_border_and_no_boxes():
    image = grey()
    out = annotate(image, detection([[-10, -5, 100, 60], [5, 5, 20, 20]], [0, 2]))
    assert (out[:, 47, 30] == torch.tensor(PALETTE[0], dtype=torch.uint8)).all()  # clamped to the last row
    empty = annotate(image, detection([], []))
    assert torch.equal(empty, image) and empty.data_ptr() != image.data_ptr()


def test_classification_lists_the_top_classes_top_left():
    image = grey(120, 160)
    probs = torch.tensor([0.1, 0.7, 0.2])
    out = annotate(image, Result("a.jpg", None, None, (120, 160), NAMES, "classify", probs=probs))
    changed = (out != image).any(0)
    assert (image == 100).all()
    rows = changed.any(1).nonzero().flatten()
    assert rows.min() < 5 and 30 < rows.max() < 70  # three lines of text from the top
    assert not changed[80:].any() and not changed[:, 120:].any()
    assert (out[:, rows.min() + 1, 1] == 0).all()  # the black background behind the text


def test_stills_are_named_like_their_inputs_without_overwriting(tmp_path):
    save_dir = tmp_path / "runs" / "predict" / "exp"
    saver = Saver(save_dir)
    assert not save_dir.exists()  # nothing saved yet, no folder
    paths = [saver.save(still("x.jpg", 0, "a/x.jpg"), grey()),
             saver.save(still("x.JPG", 1, "b/x.JPG"), grey()),
             saver.save(still("p.png", 2, "p.png"), grey()),
             saver.save(still("w.webp", 3, "w.webp"), grey()),
             saver.save(still("image4", 4), grey()),
             saver.save(still("image4.jpg", 5, "c/image4.jpg"), grey())]
    saver.close()
    assert [p.name for p in paths] == ["x.jpg", "x_2.jpg", "p.png", "w.jpg", "image4.jpg", "image4_2.jpg"]
    assert sorted(p.name for p in save_dir.iterdir()) == sorted(p.name for p in paths)
    assert decode_image(str(save_dir / "p.png")).shape == (3, 48, 64)
    assert (decode_image(str(save_dir / "x.jpg")).int() - 100).abs().max() <= 2


def test_predict_dir_numbers_like_training_and_creates_nothing(tmp_path):
    project = tmp_path / "predict"
    assert predict_dir(project) == project / "exp"
    assert not project.exists()
    (project / "exp").mkdir(parents=True)
    assert predict_dir(project) == project / "exp2"
    assert predict_dir(project, "exp", exist_ok=True) == project / "exp"
    assert predict_dir(project, "mine") == project / "mine"


def test_a_video_becomes_one_mp4_with_every_frame(tmp_path):
    with Saver(tmp_path) as saver:
        for frame in video_frames("clip.mp4", 7, h=47, w=63, fps=12.5):
            path = saver.save(frame, frame.image)
        assert path == tmp_path / "clip.mp4" and not path.exists()  # finished on close
    frames, codec, size, fps = read_video(path)
    assert (frames, size, fps) == (7, (48, 64), 12.5)  # odd sides padded by one pixel for yuv420p
    assert codec in ("h264", "mpeg4")
    assert [f.frame for f in open_source(path)] == list(range(7))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.mp4"]  # no temp file left


def test_the_same_video_twice_and_a_still_after_it(tmp_path):
    with Saver(tmp_path) as saver:
        first = [saver.save(f, f.image) for f in video_frames("clip.mp4", 3)][-1]
        second = [saver.save(f, f.image) for f in video_frames("clip.mp4", 2)][-1]
        assert first.exists()  # finished when the next video began
        saver.save(still("a.jpg", 5, "a.jpg"), grey())
        assert second.exists()  # finished when a still image came
    assert (first.name, second.name) == ("clip.mp4", "clip_2.mp4")
    assert (read_video(first)[0], read_video(second)[0]) == (3, 2)


def test_mpeg4_where_libx264_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(draw, "VIDEO_CODECS", ("no-such-encoder", "mpeg4"))
    with Saver(tmp_path) as saver:
        path = [saver.save(f, f.image) for f in video_frames("clip.mp4", 3)][-1]
    assert read_video(path)[:2] == (3, "mpeg4")


def test_an_interrupted_video_leaves_no_file(tmp_path):
    with pytest.raises(KeyboardInterrupt), Saver(tmp_path / "exp") as saver:
        saver.save(still("a.jpg", 0, "a.jpg"), grey())
        for frame in video_frames("clip.mp4", 3):
            saver.save(frame, frame.image)
        raise KeyboardInterrupt
    assert sorted(p.name for p in (tmp_path / "exp").iterdir()) == ["a.jpg"]  # the finished still stays


def test_saved_frames_come_from_annotate(tmp_path):
    frame = Frame(torch.from_numpy(np.full((3, 48, 64), 100, np.uint8)), "a.png", "a.png", None, 0)
    with Saver(tmp_path) as saver:
        path = saver.save(frame, annotate(frame.image, detection([[10, 10, 30, 30]], [0])))
    assert decode_image(str(path))[:, 20, 10].tolist() == list(PALETTE[0])  # png: exact pixels


def test_a_video_interrupted_before_anything_else_landed_leaves_no_folder(tmp_path):
    with pytest.raises(KeyboardInterrupt), Saver(tmp_path / "exp") as saver:
        for frame in video_frames("clip.mp4", 2):
            saver.save(frame, frame.image)
        raise KeyboardInterrupt
    assert not (tmp_path / "exp").exists()


def test_a_generator_closed_early_keeps_the_video_so_far(tmp_path):
    def frames():
        with Saver(tmp_path / "exp") as saver:
            for frame in video_frames("clip.mp4", 5):
                saver.save(frame, frame.image)
                yield frame

    gen = frames()
    next(gen), next(gen)
    gen.close()  # what a `break` out of predict(stream=True) does
    assert read_video(tmp_path / "exp" / "clip.mp4")[0] == 2


def test_a_folder_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "taken").write_text("a file, not a folder")
    from libreyolo.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot write annotated files to") as err, \
            Saver(tmp_path / "taken" / "exp") as saver:
        saver.save(still("a.jpg", 0, "a.jpg"), grey())
    assert "\n" not in str(err.value)
