"""Dataset yaml resolution: names, roots, split forms, built-in names and the errors."""

import os
from pathlib import Path

import pytest
import torch
from torchvision.io import encode_jpeg

from libreyolo.data import DataConfig, builtin_names, load_data_config
from libreyolo.data.labels import label_path
from libreyolo.errors import DataError

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")


def _images(folder: Path, n: int, prefix: str = "im") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    jpg = encode_jpeg(torch.full((3, 8, 8), 90, dtype=torch.uint8)).numpy().tobytes()
    out = []
    for i in range(n):
        (folder / f"{prefix}{i}.jpg").write_bytes(jpg)
        out.append(folder / f"{prefix}{i}.jpg")
    return out


def _yaml(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_names_as_list_and_relative_path_against_the_yaml_folder(tmp_path):
    _images(tmp_path / "ds" / "images" / "train", 3)
    _images(tmp_path / "ds" / "images" / "val", 2)
    y = _yaml(tmp_path / "cfg" / "d.yaml",
              "path: ../ds\ntrain: images/train\nval: images/val\nnames: [cat, dog]\n")
    cfg = load_data_config(str(y))
    assert isinstance(cfg, DataConfig)
    assert cfg.root == (tmp_path / "ds").resolve() and cfg.name == "d"
    assert [p.name for p in cfg.train] == ["im0.jpg", "im1.jpg", "im2.jpg"] and len(cfg.val) == 2
    assert cfg.names == ["cat", "dog"] and cfg.nc == 2


def test_names_as_dict_no_path_and_txt_lists(tmp_path):
    imgs = _images(tmp_path / "images" / "all", 4)
    (tmp_path / "train.txt").write_text(f"images/all/im0.jpg\n./images/all/im1.jpg\n\n{imgs[2]}\n")
    (tmp_path / "val.txt").write_text("images/all/im3.jpg\n")
    y = _yaml(tmp_path / "d.yaml", "train: train.txt\nval: val.txt\nnames: {1: dog, 0: cat}\n")
    cfg = load_data_config(y)
    assert cfg.root == tmp_path.resolve()
    assert cfg.train == [p.resolve() for p in imgs[:3]] and cfg.val == [imgs[3].resolve()]
    assert cfg.names == ["cat", "dog"]


def test_split_as_a_list_of_folders(tmp_path):
    _images(tmp_path / "images" / "a", 2, "a")
    _images(tmp_path / "images" / "b", 1, "b")
    y = _yaml(tmp_path / "d.yaml", "path: .\ntrain: [images/a, images/b]\nval: images/b\n"
                                   "names: [x]\n")
    assert len(load_data_config(y).train) == 3


def test_label_path_replaces_the_last_images_component():
    assert label_path(Path("/d/images/x/images/train/a.jpg")) == \
        Path("/d/images/x/labels/train/a.txt")


@pytest.mark.parametrize("text, needle", [
    ("train: images/nope\nval: images/nope\nnames: [a]\n", "images not found at"),
    ("train: images/empty\nval: images/empty\nnames: [a]\n", "train: no images"),
    ("val: images/empty\nnames: [a]\n", "'train' is missing"),
    ("train: images/empty\nval: images/empty\n", "'names' must be"),
    ("train: images/empty\nval: images/empty\nnames: {0: a, 2: b}\n", "without gaps"),
    ("train: images/empty\nval: images/empty\nnames: [a]\nnc: 3\n", "nc is 3"),
    ("train: [unclosed\n", "not valid yaml"),
])
def test_mistakes_raise_one_line_data_errors(tmp_path, text, needle):
    (tmp_path / "images" / "empty").mkdir(parents=True)
    y = _yaml(tmp_path / "d.yaml", text)
    with pytest.raises(DataError) as e:
        load_data_config(y)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_yaml_file(tmp_path):
    with pytest.raises(DataError, match="dataset yaml not found"):
        load_data_config(str(tmp_path / "none.yaml"))


def test_unknown_builtin_name_lists_the_known_ones():
    assert {"shapes", "coco128"} <= set(builtin_names())
    with pytest.raises(DataError) as e:
        load_data_config("shapez")
    msg = str(e.value)
    assert "unknown dataset 'shapez'" in msg and "coco128, shapes" in msg and "\n" not in msg


def test_builtin_name_resolves_into_the_cache():
    cfg = load_data_config("shapes")
    assert cfg.yaml_path.name == "shapes.yaml" and cfg.name == "shapes"
    assert cfg.root == Path(os.environ["LIBREYOLO_CACHE"]).resolve() / "datasets" / "shapes"
    assert all(p.is_file() for p in cfg.train[:3])


def test_binary_yaml_and_binary_image_list_are_one_line_data_errors(tmp_path):
    garbage = tmp_path / "garbage.yaml"
    garbage.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x81" * 16)
    with pytest.raises(DataError, match=r"dataset yaml .*garbage.yaml is not UTF-8 text \(byte \d+\); a binary file\?$"):
        load_data_config(garbage)
    (tmp_path / "list.txt").write_bytes(b"\xff\xd8\xff\xe0" * 8)
    y = _yaml(tmp_path / "d.yaml", "train: list.txt\nval: list.txt\nnames: [a]\n")
    with pytest.raises(DataError, match=r"train image list .*list.txt is not UTF-8 text"):
        load_data_config(y)
