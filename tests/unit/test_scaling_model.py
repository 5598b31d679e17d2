"""benchmarks/scaling_model.py: the ring cost model, the node boundary, the two overlap bounds, DDP's
buckets, the gradients counted from the registry, and --check against a ddp_scaling.py result."""

import dataclasses
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import scaling_model as sm  # noqa: E402

from libreyolo.errors import ConfigError  # noqa: E402

MiB = 1 << 20
GRADS = sm.Grads(tensors=300, buckets=(MiB, 25 * MiB, 4 * MiB), buffer_bytes=64 * 1024)


def step(step_ms=100.0, busy_ms=20.0, backward_ms=50.0, batch=8, graphed_ms=25.0):
    return sm.Step(batch, step_ms / 1e3, busy_ms / 1e3, backward_ms / 1e3, graphed_ms / 1e3, "test")


def test_one_gpu_moves_nothing():
    assert sm.allreduce(8 * MiB, 1, sm.Fabric()) == (0.0, 0.0) == sm.broadcast(MiB, 1, sm.Fabric())
    row = sm.predict(step(), GRADS, 1, sm.Fabric(), nbs=64, overlap=0.5)
    assert row["comm_ms"] == 0 and row["ddp_host_ms"] == 0
    assert row["efficiency_none"] == row["efficiency_full"] == row["efficiency_at_overlap"] == 1.0
    assert row["vs_graphed_none"] == pytest.approx(25.0 / 100.0)


def test_the_ring_runs_at_the_nccl_tests_bus_bandwidth_and_counts_its_link_latencies():
    # nccl-tests: busbw = S / t x 2(n-1)/n. With no latency the model must give back the bus bandwidth.
    free = sm.Fabric(base_lat_us=0, intra_lat_us=0, inter_lat_us=0, nics=2)
    for n in (2, 4, 8, 16, 64):
        t = sm.seconds(sm.allreduce(100 * MiB, n, free), n, free)
        assert 100 * MiB / t * 2 * (n - 1) / n == pytest.approx(free.bus_gbs(n) * 1e9)
    # 16 GPUs on 2 nodes: 30 ring steps, 2 of them across the node boundary.
    lat = sm.Fabric(base_lat_us=5, intra_lat_us=1, inter_lat_us=10)
    assert sm.allreduce(0, 16, lat)[0] == pytest.approx((5 + 28 * 1 + 2 * 10) * 1e-6)
    assert sm.allreduce(0, 8, lat)[0] == pytest.approx((5 + 14 * 1) * 1e-6)
    assert sm.broadcast(0, 16, lat)[0] == pytest.approx((5 + 14 * 1 + 1 * 10) * 1e-6)


@pytest.mark.parametrize("nbs", [1, 64])
@pytest.mark.parametrize("fabric", [sm.Fabric(), sm.Fabric(nics=1, nic_gbit=25)])
def test_efficiency_never_rises_with_more_gpus(nbs, fabric):
    for s in (step(), step(step_ms=20, busy_ms=19, backward_ms=10, batch=2)):
        rows = [sm.predict(s, GRADS, n, fabric, nbs) for n in range(1, 65)]
        for bound in ("none", "full"):
            eff = [r[f"efficiency_{bound}"] for r in rows]
            assert all(b <= a + 1e-12 for a, b in zip(eff, eff[1:])), bound
        assert rows[-1]["efficiency_none"] < rows[1]["efficiency_none"] < 1.0


def test_past_one_node_the_slowest_link_sets_the_bus():
    slow = sm.Fabric(nics=1, nic_gbit=25, gpus_per_node=8)  # one 25 Gb/s NIC a node: 3.125 GB/s
    assert slow.bus_gbs(8) == slow.intra_gbs and slow.bus_gbs(9) == pytest.approx(25 / 8)
    assert sm.Fabric(intra_gbs=100, nics=8).bus_gbs(16) == 100  # NICs faster than NVLink: NVLink bounds it
    comm = {n: sm.predict(step(), GRADS, n, slow, nbs=1)["comm_ms"] for n in (4, 8, 16)}
    assert comm[16] - comm[8] > 20 * (comm[8] - comm[4])  # the step at the node boundary
    even = sm.Fabric(nic_gbit=450, inter_lat_us=3.4)  # a network as fast as NVLink: no step
    comm = {n: sm.predict(step(), GRADS, n, even, nbs=1)["comm_ms"] for n in (4, 8, 16)}
    assert comm[16] - comm[8] < 3 * (comm[8] - comm[4])


def test_the_overlap_bounds():
    slow = sm.Fabric(nics=1, nic_gbit=25)
    per_update = 16 * 8  # 16 GPUs x batch 8, nbs 1: no accumulation
    for s in (step(), step(step_ms=50, busy_ms=49, backward_ms=30), step(step_ms=50, busy_ms=49, backward_ms=0.1)):
        for f in (0.0, 0.3, 1.0):
            row = sm.predict(s, GRADS, 16, slow, nbs=1, overlap=f)
            assert row["img_s_none"] <= row["img_s_at_overlap"] <= row["img_s_full"]
        assert sm.predict(s, GRADS, 16, slow, 1, overlap=0.0)["img_s_at_overlap"] == row["img_s_none"]
        assert sm.predict(s, GRADS, 16, slow, 1, overlap=1.0)["img_s_at_overlap"] == row["img_s_full"]
        # no overlap: compute, DDP's copies and every collective one after the other
        serial = s.step_s + row["ddp_host_ms"] / 1e3 + row["comm_ms"] / 1e3
        assert per_update / row["img_s_none"] == pytest.approx(serial)
    costs = sm.update_costs(GRADS, 16, slow, 1)
    last, rest = (sm.seconds(costs["gradients"][-1], 16, slow),
                  sum(sm.seconds(c, 16, slow) for c in costs["gradients"][:-1]))
    other = sm.seconds(costs["loss"][0], 16, slow) + sm.seconds(costs["buffers"][0], 16, slow)
    # GPU-bound, a backward longer than the other buckets' all-reduces: only the last bucket stays out
    long = step(step_ms=50, busy_ms=50, backward_ms=1e3 * rest + 1)
    assert per_update / sm.predict(long, GRADS, 16, slow, 1, op_us=0)["img_s_full"] == pytest.approx(0.05 + other + last)
    # the same with a short backward: what it cannot hide adds to the step
    short = dataclasses.replace(long, backward_s=rest / 2)
    t = per_update / sm.predict(short, GRADS, 16, slow, 1, op_us=0)["img_s_full"]
    assert t == pytest.approx(0.05 + other + last + rest / 2)
    # host-bound with room on the GPU for all of it: communication costs nothing at full overlap
    idle = step(step_ms=200, busy_ms=10)
    row = sm.predict(idle, GRADS, 16, slow, 1)
    assert per_update / row["img_s_full"] == pytest.approx(0.2 + row["ddp_host_ms"] / 1e3)
    assert row["img_s_none"] < row["img_s_full"]


def test_crossover_bandwidth_is_where_communication_equals_compute():
    s = step(step_ms=30)
    gbs = sm.crossover_gbs(s, GRADS, 64, sm.Fabric(), nbs=1)
    at = sm.Fabric(nics=1, nic_gbit=gbs * 8)
    assert sm.predict(s, GRADS, 64, at, nbs=1)["comm_over_compute"] == pytest.approx(1.0)
    assert sm.predict(s, GRADS, 64, dataclasses.replace(at, nic_gbit=gbs * 4), nbs=1)["comm_over_compute"] > 1
    assert sm.crossover_gbs(step(step_ms=0.1), GRADS, 64, sm.Fabric(), nbs=1) is None  # latency alone exceeds it


def test_buckets_close_at_ddps_caps():
    tensors = [MiB // 4] * 5 + [30 * MiB] + [MiB] * 3
    out = sm.buckets(tensors)
    assert sum(out) == sum(tensors)
    assert out == (MiB, MiB // 4 + 30 * MiB, 3 * MiB)  # first closes at 1 MiB, the next at 25 MiB, the rest left over
    assert sm.buckets([MiB]) == (MiB,) and sm.buckets([10, 20]) == (30,)


def test_gradients_of_a_registered_model_are_its_fp32_parameters():
    import torch

    from libreyolo.families import get_family

    grads = sm.grads_of("yolo9-t", 10)
    with torch.device("meta"):
        model = get_family("yolo9").build("t", 10)
    params = [p for p in model.parameters() if p.requires_grad]
    assert grads.tensors == len(params) and grads.dtype == "torch.float32"
    assert grads.grad_bytes == 4 * sum(p.numel() for p in params)
    assert grads.buffer_bytes == sum(4 * b.numel() for b in model.buffers())
    assert grads.buckets[0] >= sm.FIRST_BUCKET_BYTES and len(grads.buckets) == -(-grads.grad_bytes // sm.BUCKET_BYTES) + 1
    with pytest.raises(ConfigError, match="unknown model"):
        sm.grads_of("yolo99-q", 10)


def ddp_result(tmp_path, one, many):
    doc = {"setup": {"model": "yolo9-t", "imgsz": 640, "amp_dtype": "float16", "batch_per_gpu": 16, "gpus": 2,
                     "classes": 10},
           "summary": {"img_s_1gpu": one, "img_s_2gpu": many}}
    path = tmp_path / f"ddp_{many}.json"
    path.write_text(json.dumps(doc))
    return path


def test_check_against_a_measured_two_gpu_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sm, "grads_of", lambda arch, classes: GRADS)
    records = sm.load_records(sm.DEFAULT_STEPS)
    fabric = sm.Fabric()
    base = sm.check(ddp_result(tmp_path, 150.0, 280.0), records, fabric, 64, None, sm.OP_US)
    row = base["prediction"]
    assert base["measured_efficiency"] == pytest.approx(280.0 / 300.0)
    assert row["gpus"] == 2 and row["accumulate"] == 2 and "interpolated between b8 and b32" in base["source"]
    assert row["compute_ms"] == pytest.approx(2 * 16 / 150.0 * 1e3)  # the run's own one-GPU step
    # a run exactly as fast as the no-overlap bound implies the copy price the model used
    exact = row["img_s_none"]
    again = sm.check(ddp_result(tmp_path, 150.0, exact), records, fabric, 64, None, sm.OP_US)
    assert again["implied_op_us"] == pytest.approx(sm.OP_US)
    slower = sm.check(ddp_result(tmp_path, 150.0, 0.8 * exact), records, fabric, 64, None, sm.OP_US)
    assert slower["verdict"].startswith("below the no-overlap bound") and slower["implied_op_us"] > sm.OP_US
    faster = sm.check(ddp_result(tmp_path, 150.0, 1.2 * row["img_s_full"]), records, fabric, 64, None, sm.OP_US)
    assert faster["verdict"].startswith("above the full-overlap bound")
    assert "measured efficiency" in capsys.readouterr().out


def test_check_refuses_a_file_that_is_not_a_ddp_scaling_result(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"summary": {}}))
    with pytest.raises(ConfigError, match="not a ddp_scaling.py result"):
        sm.check(bad, [], sm.Fabric(), 64, None, sm.OP_US)


def test_cli_writes_the_table_and_json(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["scaling_model.py", "--models", "yolo9-t", "--gpus", "1,2,16", "--json", str(out)])
    assert sm.main() == 0
    doc = json.loads(out.read_text())
    [report] = doc["models"]
    assert [b["batch_per_gpu"] for b in report["batches"]] == [2, 8, 32]  # every benched batch
    assert all([r["gpus"] for r in b["rows"]] == [1, 2, 16] for b in report["batches"])
    assert capsys.readouterr().out.count("| yolo9-t |") == 9
    monkeypatch.setattr(sys, "argv", ["scaling_model.py", "--models", "yolo9-x", "--json", str(tmp_path / "no.json")])
    assert sm.main() == 2
    assert capsys.readouterr().err.strip().count("\n") == 0 and not (tmp_path / "no.json").exists()
