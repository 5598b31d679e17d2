"""The key=value grammar: both spellings of every kind of value give the same typed value."""

import pytest

from libreyolo.cli.grammar import parse_overrides, split_pairs
from libreyolo.errors import ConfigError

# (key, raw value, parsed): negative numbers, paths and names with dashes, floats, booleans.
VALUES = [
    ("save_period", "-1", -1),
    ("data", "/a/my-data.yaml", "/a/my-data.yaml"),
    ("data", "../my-sets/v-2.yaml", "../my-sets/v-2.yaml"),
    ("name", "my-run", "my-run"),
    ("name", "-run-", "-run-"),
    ("project", "runs/my-project", "runs/my-project"),
    ("model", "yolo9-t", "yolo9-t"),
    ("lr0", "1e-3", 0.001),
    ("device", "cuda:0", "cuda:0"),
    ("amp", "false", False),
    ("epochs", "1_000", 1000),
]


@pytest.mark.parametrize("key,raw,parsed", VALUES, ids=[f"{k}={v}" for k, v, _ in VALUES])
def test_every_spelling_gives_the_value_as_typed(key, raw, parsed):
    dashed = key.replace("_", "-")
    for tokens in ([f"{key}={raw}"], [f"--{key}={raw}"], [f"--{key}", raw], [f"--{dashed}={raw}"],
                   [f"--{dashed}", raw]):
        assert parse_overrides(tokens) == {key: parsed}, tokens


@pytest.mark.parametrize("tokens", [["--epochs=-1"], ["--epochs", "-1"], ["epochs=-1"], ["--batch=-4"],
                                    ["--batch", "-4"], ["batch=-4"]])
def test_negative_values_are_refused_not_respelled(tokens):
    with pytest.raises(ConfigError, match=r"bad value for '(epochs|batch)': -[14] \(allowed: int (>= 1|in \[1, 100000\])\)"):
        parse_overrides(tokens)


@pytest.mark.parametrize("raw", ["1e29", "2.0", "1e3", "٣", "0x10", "5_", "_5", "1__0"])
def test_ints_are_digits_only(raw):
    with pytest.raises(ConfigError, match="allowed: int"):
        parse_overrides([f"epochs={raw}"])


def test_absurd_epochs_are_refused():
    with pytest.raises(ConfigError, match=r"'epochs': 100000000000000000000000000000 \(allowed: int in \[1, 100000\]\)"):
        parse_overrides(["epochs=100000000000000000000000000000"])
    assert parse_overrides(["epochs=100000"]) == {"epochs": 100000}


@pytest.mark.parametrize("key,raw", [("name", ""), ("name", "  "), ("name", "a/b"), ("name", ".."), ("project", "")])
def test_run_names_are_one_folder(key, raw):
    with pytest.raises(ConfigError, match=f"bad value for '{key}'"):
        parse_overrides([f"{key}={raw}"])


def test_only_the_key_is_respelled():
    assert split_pairs(["--save-period=-1", "--name=my-run"]) == [("save_period", "-1"), ("name", "my-run")]


@pytest.mark.parametrize("argv,code", [(["--version"], 0), (["train", "nokey=1"], 2)])
def test_the_command_freezes_the_collector_on_its_way_out(argv, code):
    """Python's last collection at shutdown walks every object torch made (about a second of a
    short command); the command skips it by freezing them, on success and on error alike."""
    import subprocess
    import sys

    script = ("import atexit, gc, sys\n"
              "from libreyolo.cli.entry import main\n"
              "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
              "main(sys.argv[1:])\n")
    run = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120)
    assert run.returncode == code, run.stderr
    assert run.stdout.splitlines()[-1] == "frozen True"
