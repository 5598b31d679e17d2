"""atomic.py: a write replaces the target whole or leaves it as it was, and leaves no temp file;
a temp file left by a killed write is one remove_stale_temps finds."""

import json
import math

import pytest

from libreyolo.atomic import atomic_path, write_json_atomic, write_text_atomic
from libreyolo.engine.checkpoint import remove_stale_temps


def test_writes_replace_the_target_and_leave_no_temp(tmp_path):
    write_text_atomic(tmp_path / "a.txt", "one")
    assert write_text_atomic(tmp_path / "a.txt", "two").read_text() == "two"
    assert write_text_atomic(tmp_path / "sub" / "b.txt", "three").read_text() == "three"  # folder made
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.txt", "b.txt", "sub"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = write_json_atomic(tmp_path / "profile.json", {"ok": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]


def test_json_is_strict_and_cleaned_of_nan(tmp_path):
    path = write_json_atomic(tmp_path / "f.json", {"x": [math.nan, 1.5, (math.inf, 2)], "y": None})
    assert path.read_text() == '{\n "x": [\n  null,\n  1.5,\n  [\n   null,\n   2\n  ]\n ],\n "y": null\n}\n'
    with pytest.raises(ValueError):  # not cleaned: strict JSON refuses NaN rather than writing it
        write_json_atomic(path, {"x": math.nan}, clean=False)
    assert json.loads(path.read_text())["y"] is None


def test_the_temp_name_is_one_remove_stale_temps_finds(tmp_path):
    # A kill -9 mid-write skips the cleanup: the temp stays under this name until a run removes it.
    with pytest.raises(KeyboardInterrupt), atomic_path(tmp_path / "last.pt") as tmp:
        tmp.write_bytes(b"PK half")
        assert remove_stale_temps(tmp_path) == [tmp]
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []  # and any error (here the one raised) removes it
