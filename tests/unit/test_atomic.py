"""atomic.py: a write replaces the target whole or leaves it as it was, and leaves no temp file;
a temp file left by a killed write is one remove_stale_temps finds."""

import json
import math

import pytest

from libreyolo.atomic import atomic_path, check_writable, write_json_atomic, write_text_atomic
from libreyolo.engine.checkpoint import remove_stale_temps
from libreyolo.engine.rundir import make_run_dir
from libreyolo.errors import RunDirError, WriteError


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


def test_check_writable_refuses_what_no_write_could_make(tmp_path):
    (tmp_path / "f.jpg").write_text("a file")
    refused = [(tmp_path / "f.jpg" / "x.json", False, "f.jpg is a file, not a folder"),
               (tmp_path / "f.jpg" / "deeper" / "x.json", False, "f.jpg is a file, not a folder"),
               (tmp_path, False, "it is a folder; name a file"),
               (tmp_path / "f.jpg", True, "it is a file, not a folder"),
               (tmp_path / "f.jpg" / "exp", True, "f.jpg is a file, not a folder")]
    for path, folder, said in refused:
        with pytest.raises(WriteError, match=said):
            check_writable(path, "output", folder=folder)
    for path, folder in ((tmp_path / "new" / "deep" / "x.json", False), (tmp_path / "f.jpg", False),
                         (tmp_path / "new" / "run", True), (tmp_path, True)):
        assert check_writable(path, "output", folder=folder) == path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.jpg"]  # a check makes nothing


def test_a_run_directory_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "f.jpg").write_text("a file")
    with pytest.raises(RunDirError, match="cannot make a run directory under"):
        make_run_dir(str(tmp_path / "f.jpg"), "exp", exist_ok=False)
