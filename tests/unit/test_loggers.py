"""TensorBoard and MLflow: one tiny real run on a COCO-json dataset, read back with TensorBoard's own
reader and the real MLflow client (a file store in a temp dir); a tracking server that is down;
the start lines; a resume logging into its first MLflow run."""

import json
import logging
from types import SimpleNamespace

import pytest
from coco_kit import write_coco

from libreyolo import LibreYOLO
from libreyolo.config import build_config
from libreyolo.engine import loggers
from libreyolo.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")
pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install 'libreyolo[tensorboard]')")
pytest.importorskip("mlflow", reason="mlflow is not installed (pip install 'libreyolo[mlflow]')")

TINY = dict(imgsz=64, batch=3, device="cpu", workers=0, amp=False, cache=False, log_interval=1, warmup_epochs=0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """2 epochs x 2 steps of YOLOv9-t on the COCO form, with the profiler over steps 2-4."""
    tmp = tmp_path_factory.mktemp("loggers")
    data = write_coco(tmp / "coco")
    store = (tmp / "mlruns").as_uri()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", store)
        mp.setenv("MLFLOW_EXPERIMENT_NAME", "tiny")
        result = LibreYOLO("yolo9-t").train(data=str(data), epochs=2, project=str(tmp / "runs"), tensorboard=True,
                                            mlflow=True, profile=True, profile_skip=0, profile_steps=2, **TINY)
    return result, store


def test_tensorboard_event_file_holds_every_figure_per_epoch(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result, _ = run
    events = EventAccumulator(str(result.run_dir))
    events.Reload()
    scalars = events.Tags()["scalars"]
    for key in ("train/box", "train/cls", "train/dfl", "metrics/map50_95", "metrics/map50", "lr/weights", "lr/bias",
                "lr/norm", "speed/img_s", "speed/step_ms"):
        assert [e.step for e in events.Scalars(key)] == [1, 2], key
    csv_rows = (result.run_dir / "results.csv").read_text().splitlines()
    assert float(csv_rows[-1].split(",")[1]) == pytest.approx(events.Scalars("train/box")[-1].value, rel=1e-5)
    assert all(e.value > 0 for e in events.Scalars("speed/img_s"))
    text = events.Tensors("profile/verdict/text_summary")[0].tensor_proto.string_val[0].decode()
    summary = json.loads((result.run_dir / "profile_summary.json").read_text())
    assert summary["verdict"] in text and summary["lever"] in text
    assert "profile/step_ms_mean" in scalars


def test_mlflow_file_store_has_params_metrics_and_artifacts(run):
    import mlflow

    result, store = run
    client = mlflow.MlflowClient(store)
    (found,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert found.info.status == "FINISHED" and found.info.run_name == result.run_dir.name
    assert found.data.params["imgsz"] == "64" and found.data.params["mlflow"] == "true"
    assert [m.step for m in client.get_metric_history(found.info.run_id, "metrics/map50")] == [1, 2]
    assert {"train/box", "lr/weights", "speed/img_s"} <= set(found.data.metrics)
    top = {a.path for a in client.list_artifacts(found.info.run_id)}
    assert {"results.html", "results.csv", "args.yaml", "profile_summary.json", "profile_verdict.md"} <= top
    assert [a.path for a in client.list_artifacts(found.info.run_id, "weights")] == ["weights/best.pt"]
    assert found.data.tags["profile.verdict"] == json.loads((result.run_dir / "profile_summary.json").read_text())["verdict"]


def test_a_tracking_server_that_is_down_is_one_warning_and_training_goes_on(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # the discard port: refused at once
    data = write_coco(tmp_path / "coco")
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        result = LibreYOLO("yolo9-t").train(data=str(data), epochs=1, project=str(tmp_path / "runs"), mlflow=True,
                                            tensorboard=False, val=False, **TINY)
    assert result.epochs_run == 1 and result.last.is_file()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mlflow")]
    assert len(lines) == 1 and "http://127.0.0.1:9" in lines[0] and "training goes on without mlflow" in lines[0]
    assert "\n" not in lines[0]


def test_start_lines_and_a_missing_package(monkeypatch, caplog):
    cfg = lambda **kw: build_config({"model": "yolo9-t", **kw})  # noqa: E731
    assert [type(h).__name__ for h in loggers.logger_hooks(cfg())] == ["DataVerdictHook", "TensorBoardHook"]
    monkeypatch.setattr(loggers, "installed", lambda package: False)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        assert [type(h).__name__ for h in loggers.logger_hooks(cfg())] == ["DataVerdictHook"]
    assert "tensorboard: off (tensorboard=auto, and the package is not installed" in caplog.text
    for key in ("tensorboard", "mlflow"):
        with pytest.raises(ConfigError, match=f"{key}=true: the {key} package is not installed"):
            loggers.logger_hooks(cfg(**{key: True}))


def test_gpu_memory_is_logged_when_the_meter_has_it():
    trainer = SimpleNamespace(
        epoch_losses=lambda: {"box": 1.0}, metrics={}, validated_epoch=-1, epoch=0, batch_index=3,
        optimizer=SimpleNamespace(param_groups=[{"name": "weights", "lr": 0.01}, {"lr": 0.02}]),
        clock=SimpleNamespace(epochs=[2.0]), cfg=SimpleNamespace(batch=8), train_loader=SimpleNamespace(num_images=30),
        last_log={"img_s": 1.0, "mem_gb": 1.5})
    figures = loggers.epoch_figures(trainer)
    assert figures == {"train/box": 1.0, "lr/weights": 0.01, "lr/1": 0.02, "speed/img_s": 15.0, "speed/step_ms": 500.0,
                       "memory/gpu_reserved_gb": 1.5}


def test_a_resume_logs_into_its_first_mlflow_run(tmp_path, monkeypatch):
    import mlflow

    store = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    trainer = SimpleNamespace(run_dir=tmp_path / "exp", arch="YOLOv9-t", data_cfg=SimpleNamespace(name="d", names=["a"]),
                              cfg=build_config({"model": "yolo9-t"}), start_epoch=0, hooks=[])
    first = loggers.MLflowHook()
    first.before_train(trainer)
    state = first.state_dict()
    again = loggers.MLflowHook()
    again.load_state_dict(state)
    trainer.start_epoch = 3
    again.before_train(trainer)
    client = mlflow.MlflowClient(store)
    (found,) = client.search_runs([client.get_experiment_by_name("libreyolo").experiment_id])
    assert again.run_id == first.run_id == found.info.run_id and found.data.tags["libreyolo.resumed_at_epoch"] == "4"
