"""Model names: official weights names and family spellings (the registry's look-ups, families/__init__.py),
size spellings and the torch-free missing-file rule (names.py)."""

from libreyolo.families import get_family, parse_family, parse_official
from libreyolo.names import is_missing_weights, parse_size

YOLO9, YOLOX = get_family("yolo9"), get_family("yolox")


def test_official_names_are_exact():
    assert parse_official("LibreYOLO9s.pt") == (YOLO9, "s") and parse_official("LibreYOLOXn.pt") == (YOLOX, "n")
    for name in ("LibreYOLO9q.pt", "libreyolo9s.pt", "LibreYOLO9s.pth", "LibreYOLO9S.pt", "yolo9-s"):
        assert parse_official(name) is None, name


def test_family_and_size_spellings():
    assert parse_family("YOLOv9") is YOLO9 and parse_family("yolo_9") is YOLO9 and parse_family("yolo9-t") is None
    assert parse_size(YOLO9, "Tiny") == "t" and parse_size(YOLO9, "c") == "c" and parse_size(YOLO9, "x") is None


def test_missing_weights_without_the_registry(tmp_path):
    (tmp_path / "w.pt").write_bytes(b"")
    assert is_missing_weights("gone.pt") and is_missing_weights("runs/x/best.pth")
    for name in (str(tmp_path / "w.pt"), "LibreYOLO9s.pt", "LibreAnything.pt", "yolo9-t", "gone.onnx"):
        assert not is_missing_weights(name), name
