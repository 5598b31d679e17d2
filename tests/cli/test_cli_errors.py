"""Bad input at the command line: one line on stderr, exit code 2, no traceback, nothing written;
and what the command line shows about its keys (cfg, --help)."""

import re

import pytest

CASES = [
    (["train", "epoch=3"], "unknown key 'epoch' (did you mean 'epochs'?)"),
    (["train", "batch=abc"], "bad value for 'batch': 'abc' (allowed: int)"),
    (["train", "epochs"], "expected key=value, got 'epochs' (did you mean 'epochs=...'?)"),
    (["train", "amp=maybe"], "bad value for 'amp': 'maybe' (allowed: bool)"),
    (["train", "optimizer=adam"], "bad value for 'optimizer': 'adam' (allowed: auto|sgd|adamw)"),
    (["train", "mosaic=1.5"], "bad value for 'mosaic': 1.5 (allowed: float in [0.0, 1.0])"),
    (["train", "epochs=0"], "bad value for 'epochs': 0 (allowed: int in [1, 100000])"),
    (["train", "batch=2", "batch=4"], "key 'batch' given twice"),
    (["train", "amp_dtype=float8"], "bad value for 'amp_dtype': 'float8' (allowed: float16|bfloat16)"),
    (["train", "lr0=nan"], "bad value for 'lr0': 'nan' (allowed: float)"),
    (["train", "cache=maybe"], "bad value for 'cache': 'maybe' (allowed: auto|false|ram|disk)"),
    (["train", "--batch"], "'--batch' needs a value: batch=VALUE"),
    (["train", "=3"], "missing key in '=3'"),
    (["val", "epochs=3"], "key 'epochs' does not apply here"),
    (["train", "data=shapes"], "no model given"),
    (["train", "model=yolo9-t"], "no dataset given: pass data=NAME"),
    (["train", "model=yolo9-t", "data=shapes", "imgsz=100"], "bad value for 'imgsz': 100 (allowed: a multiple of 32)"),
    (["train", "model=yolo9-t", "data=shapes", "cuda_graph=maybe"], "bad value for 'cuda_graph': 'maybe' (allowed: auto|full|bool)"),
    (["train", "model=foo", "data=shapes"], "unknown model 'foo': not a file, an official weights name"),
    (["train", "model=missing.pt", "data=shapes"], "weights file 'missing.pt' does not exist"),
    (["train", "model=yolo9-x", "data=shapes"], "unknown model 'yolo9-x'"),
    (["train", "model=yolo9-t", "data=no_such_dataset"], "no_such_dataset"),
    (["train", "model=yolo9-t", "data=missing/data.yaml"], "missing/data.yaml"),
    (["train", "model=yolo9-t", "data=shapes", "device=cuda:3"], "device 'cuda:3'"),
    (["train", "model=yolo9-t", "data=shapes", "device=0,1"], "torchrun --nproc_per_node 2"),
    (["val", "data=shapes"], "no model given"),
]


@pytest.fixture
def inproc(capsys, tmp_path, monkeypatch):
    """Like the `cli` fixture, through the command's entry point in this process (cwd tmp_path):
    no interpreter start-up per call (the real process: test_bad_input_matrix.py's wiring test)."""
    from types import SimpleNamespace

    from testkit import run_in_process

    monkeypatch.chdir(tmp_path)

    def run(*args: str):
        code, out, err = run_in_process(list(args), capsys)
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return run


@pytest.mark.parametrize("args,message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, capfd, args, message):
    # The command's entry point in this process (a real process: test_bad_input_matrix.py's
    # wiring test); an exception escaping main() would fail the test with its traceback.
    from testkit import run_in_process

    monkeypatch.chdir(tmp_path)
    code, _, stderr = run_in_process(list(args), capfd)
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    assert message in lines[0]
    assert not (tmp_path / "runs").exists(), "nothing may be written for a bad command"


def test_corrupt_checkpoint_is_one_line(inproc, tmp_path):
    (tmp_path / "bad.pt").write_bytes(b"this is not a checkpoint")
    result = inproc("train", "model=bad.pt", "data=shapes")
    assert result.returncode == 2
    assert result.stderr.startswith("error: 'bad.pt' is not a")
    assert len(result.stderr.strip().splitlines()) == 1


def test_foreign_checkpoint_is_one_line(inproc, tmp_path):
    import torch

    torch.save({"state_dict": {"w": torch.zeros(2)}}, tmp_path / "other.pt")
    result = inproc("val", "model=other.pt", "data=shapes")
    assert result.returncode == 2
    assert "not a LibreYOLO checkpoint (foreign file)" in result.stderr


def test_debug_shows_traceback(cli):
    result = cli("train", "epoch=3", env={"LIBREYOLO_DEBUG": "1"})
    assert result.returncode != 0
    assert "Traceback" in result.stderr


def test_cfg_lists_every_key(inproc):
    from libreyolo.config import FIELDS

    result = inproc("cfg")
    assert result.returncode == 0
    header, *lines = result.stdout.splitlines()
    assert header.split() == ["key", "default", "type", "meaning"]  # the columns are named
    assert [line.split()[0] for line in lines] == list(FIELDS)
    assert any(line.split()[:3] == ["epochs", "100", "int"] for line in lines)
    assert inproc("cfg", "model=yolox-t").stdout.splitlines()[0].split() == ["key", "default", "type", "source",
                                                                          "meaning"]


def test_train_help_shows_the_key_groups_the_most_used_keys_and_json(cli):
    from libreyolo.config import FIELDS

    text = cli("train", "--help").stdout
    assert "--json" in text and "Most used keys" in text
    assert any(line.split()[:2] == ["epochs=", "100"] for line in text.splitlines())
    assert any(line.split()[:2] == ["imgsz=", "640"] for line in text.splitlines())
    for title in ("what to train:", "loop:", "optimisation:", "augmentation:", "speed levers:", "validation:",
                  "output:"):
        assert title in text
    words = set(text.replace(":", " ").split())
    assert set(FIELDS) <= words  # every key is listed under its group


def test_val_help_lists_every_key_it_accepts(cli):
    from libreyolo.config import VAL_KEYS

    text = cli("val", "--help").stdout
    shown = [line.split()[0][:-1] for line in text.splitlines() if re.match(r"\s+[a-z_]+=\s", line)]
    assert shown == list(VAL_KEYS) and "--json" in text and "ckpt*" in text
    assert {"project", "name", "exist_ok"}.isdisjoint(VAL_KEYS)  # val writes no run directory


def test_bench_step_help_lists_the_keys_it_accepts(inproc):
    from libreyolo.config import FIELDS

    text = inproc("bench", "step", "--help").stdout
    shown = [line.split()[0][:-1] for line in text.splitlines() if re.match(r"\s+[a-z_]+=\s", line)]
    assert shown[:2] == ["model", "data"] and set(shown) <= set(FIELDS)  # the table: what the arms change
    assert any(line.split()[:2] == ["batch=", "16"] for line in text.splitlines())
    assert "Every key by group" in text and "arms=" in text
    assert set(FIELDS) <= set(text.replace(":", " ").split())  # every key it parses, by group
    assert "unknown key 'bogus'" in inproc("bench", "step", "bogus=1").stderr  # and no other


def test_cfg_json_parses(inproc):
    import json

    rows = json.loads(inproc("cfg", "--json").stdout)
    by_key = {r["key"]: r for r in rows}
    assert by_key["amp_dtype"]["type"] == "float16|bfloat16"
    assert by_key["cache"]["type"] == "auto|false|ram|disk"
    assert all(r["doc"] for r in rows)


def test_cfg_of_a_model_shows_its_defaults_and_where_they_come_from(inproc):
    import json

    rows = {r["key"]: r for r in json.loads(inproc("cfg", "model=yolox-t", "--json").stdout)}
    # the tiny recipe's, used in long runs only (recipe=auto)
    assert (rows["mixup"]["default"], rows["mixup"]["source"]) == ("0.0", "yolox-t, long runs")
    assert (rows["box"]["default"], rows["box"]["source"]) == ("5.0", "yolox")         # the family's, always
    assert (rows["epochs"]["default"], rows["epochs"]["source"]) == ("100", "base")
    text = inproc("cfg", "LibreYOLOXs.pt").stdout  # an official weights name: parsed, never downloaded
    assert any(line.split()[:5] == ["mixup", "1.0", "float", "yolox,", "long"] for line in text.splitlines())
    bad = inproc("cfg", "yolox-q")
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown model 'yolox-q'") and not bad.stdout
    both = inproc("cfg", "yolox-t", "--markdown")
    assert both.returncode == 2 and "leave out the model" in both.stderr


def test_version(cli):
    from pathlib import Path

    from libreyolo import __version__

    result = cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"libreyolo {__version__}"
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'\nversion = "{__version__}"\n' in pyproject  # version.py follows [project] version


def test_hyperparameters_doc_is_generated():
    """docs/hyperparameters.md must be exactly what `libreyolo cfg --markdown` prints."""
    from pathlib import Path

    from libreyolo.docs import hyperparameters_markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "hyperparameters.md"
    assert doc.read_text() == hyperparameters_markdown(), "run `make docs` to regenerate"


def test_cfg_of_the_detrs_shows_amp_off_and_the_inherited_recipe(capsys):
    import json

    from testkit import run_in_process

    def rows(model):
        code, out, err = run_in_process(["cfg", f"model={model}", "--json"], capsys)
        assert code == 0, err
        return {r["key"]: (r["default"], r["source"]) for r in json.loads(out)}

    dfine = rows("dfine-n")
    assert dfine["amp"] == ("false", "dfine") and dfine["lr0"] == ("0.0008", "dfine-n")
    assert dfine["backbone_lr"] == ("0.5", "dfine") and dfine["clip_grad"] == ("0.1", "dfine")
    v4 = rows("rtdetrv4-s")  # every recipe value inherited from DEIM, named as DEIM's
    assert {k: v4[k] for k in ("amp", "lr0", "lr_schedule", "lr_flat", "mosaic", "backbone_lr")} == {
        "amp": ("false", "deim"), "lr0": ("0.0004", "deim"), "lr_schedule": ("flat_cosine", "deim"),
        "lr_flat": ("0.485", "deim"), "mosaic": ("0.5", "deim"), "backbone_lr": ("0.5", "deim")}
    assert v4["task"] == ("detect", "rtdetrv4") and v4["epochs"] == ("100", "base")
    assert rows("LibreRTDETRr18.pt")["backbone_lr"] == ("0.1", "rtdetr")  # an official name, parsed only
    v2 = rows("LibreDEIMv2atto.pt")  # DEIM's recipe inherited, AMP on as upstream trains it
    assert {k: v2[k] for k in ("amp", "lr_schedule", "lr0", "imgsz", "mixup")} == {
        "amp": ("true", "deimv2"), "lr_schedule": ("flat_cosine", "deim"), "lr0": ("0.002", "deimv2-atto"),
        "imgsz": ("320", "deimv2-atto"), "mixup": ("0.0", "deimv2, long runs")}
