import pytest

from libreyolo.cli.grammar import parse_overrides, parse_value, split_pairs
from libreyolo.config import FIELDS, TrainConfig, build_config, check_value, describe_type, key_type
from libreyolo.errors import ConfigError


@pytest.mark.parametrize("raw,expected", [("true", True), ("False", False), ("1", True), ("0", False),
                                          ("yes", True), ("no", False)])
def test_bool_forms(raw, expected):
    assert parse_value("amp", raw) is expected


def test_typed_values():
    assert parse_value("epochs", "12") == 12
    assert parse_value("lr0", "1e-3") == pytest.approx(0.001)
    assert parse_value("lr0", "2") == 2.0
    assert parse_value("model", "none") is None
    assert parse_value("model", "'none'") == "none"  # quoted: a string, not None
    assert parse_value("name", '"my run"') == "my run"
    assert parse_value("cache", "ram") == "ram"
    assert parse_value("cache", "false") is False
    assert parse_value("resume", "true") is True
    assert parse_value("resume", "runs/train/exp/weights/last.pt") == "runs/train/exp/weights/last.pt"
    assert parse_value("device", "0,1") == "0,1"  # list syntax stays a string for device
    assert parse_value("optimizer", "AdamW") == "adamw"


def test_quoted_number_is_not_an_int():
    with pytest.raises(ConfigError, match="bad value for 'epochs'"):
        parse_value("epochs", "'3'")


def test_flag_forms():
    assert split_pairs(["--epochs", "3", "--amp=false", "batch=2", "--exist-ok"]) == [
        ("epochs", "3"), ("amp", "false"), ("batch", "2"), ("exist_ok", "true")]
    assert parse_overrides(["--epochs", "3", "amp=false"]) == {"epochs": 3, "amp": False}


def test_layering_family_then_user():
    cfg = build_config({"epochs": 5}, {"epochs": 50, "mosaic": 0.5})
    assert cfg.epochs == 5 and cfg.mosaic == 0.5
    assert build_config({}).epochs == FIELDS["epochs"].default


def test_python_values_are_type_checked():
    with pytest.raises(ConfigError, match="bad value for 'batch'"):
        build_config({"batch": "8"})
    with pytest.raises(ConfigError, match="bad value for 'amp'"):
        build_config({"amp": 1})
    assert build_config({"lr0": 1}).lr0 == 1.0  # int is a fine float


def test_family_default_is_validated_too():
    with pytest.raises(ConfigError, match="unknown key 'epoch'"):
        build_config({}, {"epoch": 3})


def test_every_key_has_doc_and_describable_type():
    for key, f in FIELDS.items():
        assert f.metadata["doc"], key
        assert describe_type(key_type(key))
        check_value(key, f.default)  # every default is valid
    assert TrainConfig().to_dict()["imgsz"] == 640


def test_cuda_graph_takes_a_bool_or_auto_and_defaults_to_auto():
    assert build_config({"cuda_graph": True}).cuda_graph is True
    assert build_config({"cuda_graph": False}).cuda_graph is False
    assert build_config({}).cuda_graph == "auto" == build_config({"cuda_graph": "auto"}).cuda_graph
