"""The CUDA graph manager on CPU (issue 6): counting, gating, fallbacks, invalidation, stats.

Two stand-in backends:
- FakeBackend "captures" by returning a callable that runs the module itself (and counts
  replays), so outputs and gradients are exactly eager's: it tests the manager's decisions.
- EmulatedBackend builds the real backend's CapturedShape with graphs that are Python closures
  writing into the same static buffers a CUDA graph would. It runs the real autograd node
  (_GraphedRegion) on CPU: static outputs, static gradient buffers, gradient accumulation across
  replays, the eager recomputation when a backward replay fails.
"""

import contextlib
import copy
import logging
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from libreyolo.engine import graphs
from libreyolo.engine.graphs import CAPTURE_AFTER, CapturedShape, GraphManager, input_key
from libreyolo.families.base import CapturePlan


class Tiny(nn.Module):
    """conv-BN-SiLU with two outputs, like a detector's per-level maps."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        y = torch.nn.functional.silu(self.bn(self.conv(x)))
        return y, self.head(y)


def images(b=2, size=8, seed=0):
    return torch.randn(b, 3, size, size, generator=torch.Generator().manual_seed(seed))


def loss_of(outputs):
    return sum((o.float() * (i + 1)).square().mean() for i, o in enumerate(outputs))


def step(fn, x):
    out = fn(x)
    loss_of(out).backward()
    return [o.detach().clone() for o in out]


def grads(module):
    return [p.grad.clone() for p in module.parameters()]


def assert_same(a, b, atol=1e-6):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=atol, rtol=1e-5)


def steps_match(manager, ref, seeds):
    """One training step per seed through both; every step's outputs must agree."""
    for i in seeds:
        x = images(seed=i)
        assert_same(step(manager, x), step(ref, x))


@pytest.fixture
def libreyolo_log(caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("libreyolo"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        yield caplog


def lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "libreyolo"]


class FakeGraph:
    def __init__(self, module, sample, backend):
        self.module, self.backend, self.key = module, backend, input_key(sample)
        self.pool_mb = backend.pool_mb

    def __call__(self, x):
        assert input_key(x) == self.key, "the manager replayed a graph for another input layout"
        if self.backend.fail_replay:
            raise RuntimeError("planted replay failure")
        self.backend.replays += 1
        return self.module(x)


class FakeBackend:
    def __init__(self, fail_capture=False, fail_replay=False, pool_mb=12.5):
        self.fail_capture, self.fail_replay, self.pool_mb = fail_capture, fail_replay, pool_mb
        self.captures = self.replays = self.releases = 0

    def capture(self, module, sample, autocast, on_error):
        self.captures += 1
        assert not sample.requires_grad
        if self.fail_capture:
            raise RuntimeError("planted capture failure\nwith a second line")
        return FakeGraph(module, sample, self)

    def release(self):
        self.releases += 1


def pair(backend, **kwargs):
    torch.manual_seed(0)
    module = Tiny().train()
    return GraphManager(module, backend=backend, **kwargs), copy.deepcopy(module)


# --- counting and gating --------------------------------------------------------------------------
def test_third_sighting_captures_and_later_steps_replay_exactly_like_eager(libreyolo_log):
    backend = FakeBackend()
    manager, ref = pair(backend)
    for i in range(6):
        x = images(seed=i)
        assert_same(step(manager, x), step(ref, x))
        assert backend.captures == (0 if i < 2 else 1)
    assert backend.replays == 4  # steps 3..6 (the capturing step replays too)
    assert_same(grads(manager.module), grads(ref))
    assert_same(list(manager.module.buffers()), list(ref.buffers()))
    [line] = lines(libreyolo_log)
    assert line.startswith("CUDA graph captured for input 2x3x8x8 float32 in ") and "memory pool 12 MB" in line


def test_other_shapes_dtypes_and_layouts_run_eager():
    backend = FakeBackend()
    manager, ref = pair(backend)
    for i in range(3):
        assert_same(step(manager, images(seed=i)), step(ref, images(seed=i)))
    others = [images(b=1), images(size=16), images().contiguous(memory_format=torch.channels_last)]
    for x in others * 3:  # each seen 3 times, but one graph is the default limit
        assert_same(step(manager, x), step(ref, x))
    assert backend.captures == 1 and backend.replays == 1
    assert_same(grads(manager.module), grads(ref))
    key = input_key(images())
    assert input_key(images().half()) != key and input_key(images().requires_grad_()) != key
    assert manager.stats()["captured_shapes"] == [[2, 3, 8, 8]]


def test_a_second_shape_is_captured_when_allowed():
    backend = FakeBackend()
    manager, _ = pair(backend, max_graphs=2)
    for _ in range(3):
        step(manager, images())
        step(manager, images(b=1))
    assert backend.captures == 2
    assert manager.stats()["captured_shapes"] == [[2, 3, 8, 8], [1, 3, 8, 8]]


def test_eval_mode_and_no_grad_run_the_plain_module_uncounted():
    backend = FakeBackend()
    manager, ref = pair(backend)
    manager.module.eval()
    ref.eval()
    for _ in range(4):
        torch.testing.assert_close(manager(images())[1], ref(images())[1])
    manager.module.train()
    with torch.no_grad():
        for _ in range(4):
            manager(images())
    assert backend.captures == 0 and manager.stats()["eager_steps"] == 0
    step(manager, images())
    step(manager, images())
    assert backend.captures == 0  # the eval/no_grad calls were not counted


# --- failures -------------------------------------------------------------------------------------
def test_capture_failure_logs_one_line_and_trains_eager(libreyolo_log):
    backend = FakeBackend(fail_capture=True)
    manager, ref = pair(backend)
    steps_match(manager, ref, range(8))
    assert_same(grads(manager.module), grads(ref))
    assert backend.captures == 1 and backend.releases == 1  # never retried
    [line] = lines(libreyolo_log)
    assert "capture failed for input 2x3x8x8 float32" in line and "planted capture failure" in line
    assert "second line" not in line and line.endswith("training eager for the rest of the run")
    stats = manager.stats()
    assert not stats["enabled"] and "planted capture failure" in stats["fallback_reason"]
    assert stats["replayed_steps"] == 0 and stats["eager_steps"] == 8


def test_replay_failure_logs_one_line_and_the_step_still_gets_eager_results(libreyolo_log):
    backend = FakeBackend()
    manager, ref = pair(backend)
    steps_match(manager, ref, range(4))
    backend.fail_replay = True
    steps_match(manager, ref, range(4, 8))
    assert_same(grads(manager.module), grads(ref))
    msgs = lines(libreyolo_log)
    assert len(msgs) == 2 and "replay failed" in msgs[1] and "planted replay failure" in msgs[1]
    assert manager.stats()["captured_shapes"] == [] and manager.stats()["pool_mb"] is None


# --- invalidate, stats ----------------------------------------------------------------------------
def test_invalidate_discards_and_rearms_the_counter(libreyolo_log):
    backend = FakeBackend()
    manager, _ = pair(backend)
    for _ in range(4):
        step(manager, images())
    manager.invalidate("L1 loss branch on")
    assert manager.stats()["captured_shapes"] == [] and manager.enabled
    step(manager, images())
    step(manager, images())
    assert backend.captures == 1
    step(manager, images())
    assert backend.captures == 2
    msgs = lines(libreyolo_log)
    assert len(msgs) == 3 and msgs[1].startswith("CUDA graphs invalidated (L1 loss branch on): 1 graph(s)")


def test_stats_report_replays_shapes_and_pool():
    backend = FakeBackend(pool_mb=7.0)
    manager, _ = pair(backend, max_graphs=2)
    for _ in range(4):
        step(manager, images())
    for _ in range(3):
        step(manager, images(size=16))
    assert manager.stats() == {"requested": True, "enabled": True, "replayed_steps": 3, "eager_steps": 4,
                               "captured_shapes": [[2, 3, 8, 8], [2, 3, 16, 16]], "pool_mb": 14.0,
                               "fallback_reason": None}


# --- for_run: what a training run gets -----------------------------------------------------------
FAMILY = SimpleNamespace(display="YOLOv9", capture=CapturePlan("network"))
MODEL = SimpleNamespace(capturable=Tiny())
PRECISION = SimpleNamespace(autocast=contextlib.nullcontext)
CUDA = torch.device("cuda")  # for_run decides without touching the device


@pytest.mark.parametrize("case, expected", [
    ({"device": torch.device("cpu")}, "CUDA graphs need a CUDA device (training on cpu)"),
    ({"family": SimpleNamespace(display="RT-DETR", capture=CapturePlan("none", "dynamic query count"))},
     "RT-DETR has no capturable region (dynamic query count)"),
])
def test_unsupported_runs_log_one_line_and_use_the_plain_module(libreyolo_log, case, expected):
    args = {"family": FAMILY, "device": CUDA, **case}
    manager = GraphManager.for_run(MODEL, SimpleNamespace(cuda_graph=True), args["family"], args["device"],
                                   PRECISION, backend=FakeBackend())
    assert manager.step_callable is MODEL.capturable
    [line] = lines(libreyolo_log)
    assert expected in line and line.startswith("cuda_graph=true ignored: ")
    assert manager.stats()["enabled"] is False and expected in manager.stats()["fallback_reason"]
    for _ in range(4):
        step(manager, images())  # still usable as a pass-through
    manager.invalidate("anything")
    assert manager.stats()["replayed_steps"] == 0 and len(lines(libreyolo_log)) == 1


@pytest.mark.parametrize("device", [CUDA, torch.device("cpu")])
def test_ddp_is_unsupported_with_one_line(libreyolo_log, monkeypatch, device):
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 2)
    manager = GraphManager.for_run(MODEL, SimpleNamespace(cuda_graph=True), FAMILY, device, PRECISION)
    assert manager.step_callable is MODEL.capturable
    # The multi-GPU line comes first, so a CPU DDP run (the tests') says the same as a GPU one.
    assert lines(libreyolo_log) == [
        "cuda_graph=true: not available under multi-GPU training (2 processes); training eager"]


def test_ddp_is_known_from_torchrun_before_the_process_group(libreyolo_log, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    GraphManager.for_run(MODEL, SimpleNamespace(cuda_graph=True), FAMILY, CUDA, PRECISION)
    assert lines(libreyolo_log) == [
        "cuda_graph=true: not available under multi-GPU training (4 processes); training eager"]


def test_supported_run_is_armed_silently_and_off_when_not_requested(libreyolo_log):
    manager = GraphManager.for_run(MODEL, SimpleNamespace(cuda_graph=True), FAMILY, CUDA, PRECISION,
                                   backend=FakeBackend())
    assert manager.step_callable is manager and manager.enabled
    off = GraphManager.for_run(MODEL, SimpleNamespace(cuda_graph=False), FAMILY, CUDA, PRECISION)
    assert off.step_callable is MODEL.capturable
    assert off.stats() == {"requested": False, "enabled": False, "replayed_steps": 0, "eager_steps": 0, "captured_shapes": [],
                           "pool_mb": None, "fallback_reason": None}
    assert lines(libreyolo_log) == []


@pytest.mark.parametrize("case, want, said", [
    ({}, True, "cuda_graph=auto: on, the network's forward and backward replay from a CUDA graph once a batch "
               f"size is seen {CAPTURE_AFTER} times (cuda_graph=false trains eager)"),
    ({"family": SimpleNamespace(display="RT-DETR", capture=CapturePlan("encoder"))}, True,
     "cuda_graph=auto: on, the backbone and encoder's forward and backward replay"),
    ({"multi_scale": True}, False, "cuda_graph=auto: off, multi_scale=true changes the batch's size"),
    ({"family": SimpleNamespace(display="X", capture=CapturePlan("none", "dynamic query count"))}, False,
     "cuda_graph=auto: off, X has no capturable region (dynamic query count)"),
    ({"world": "2"}, False, "cuda_graph=auto: off, not available under multi-GPU training"),
    ({"device": torch.device("cpu")}, False, None),  # no graph can be asked for on a CPU: nothing to say
    ({"cuda_graph": True}, True, None), ({"cuda_graph": False}, False, None), ({"cuda_graph": "full"}, "full", None),
])
def test_auto_is_decided_per_run_and_said_in_one_line(monkeypatch, case, want, said):
    if "world" in case:
        monkeypatch.setenv("WORLD_SIZE", case["world"])
    cfg = SimpleNamespace(cuda_graph=case.get("cuda_graph", "auto"), multi_scale=case.get("multi_scale", False))
    got, line = graphs.resolve_auto(cfg, MODEL, case.get("family", FAMILY), case.get("device", CUDA))
    assert got == want and type(got) is type(want)
    assert (line is None) if said is None else line.startswith(said)


def test_auto_left_unresolved_builds_an_eager_manager(libreyolo_log):
    """A step context built outside a training run (bench step's arms, tests) trains eager at the
    default: only the trainer decides `auto`."""
    manager = GraphManager.for_run(MODEL, SimpleNamespace(cuda_graph="auto"), FAMILY, CUDA, PRECISION)
    assert manager.step_callable is MODEL.capturable and not manager.requested
    assert lines(libreyolo_log) == []


def test_real_backend_is_the_default_and_asks_for_thread_local_capture():
    manager = GraphManager(Tiny())
    assert isinstance(manager.backend, graphs.CudaGraphBackend)
    assert graphs._capture_kwargs() == {"capture_error_mode": "thread_local"}


# --- the real autograd node, with emulated graphs -------------------------------------------------
class EmulatedGraph:
    def __init__(self, fn):
        self.fn, self.fail = fn, False

    def replay(self):
        if self.fail:
            raise RuntimeError("planted graph failure")
        self.fn()


class EmulatedBackend:
    """CudaGraphBackend's buffers and node, with Python closures standing in for the graphs."""

    def __init__(self):
        self.shapes = []

    def capture(self, module, sample, autocast, on_error):
        params = tuple(p for p in module.parameters() if p.requires_grad)
        module.eval()  # shapes only; eval leaves the BN running stats alone
        with torch.no_grad():
            probe = module(sample)
        module.train()
        static_out = tuple(torch.empty_like(o) for o in probe)
        static_grad_out = tuple(torch.empty_like(o) for o in probe)
        for p in params:  # as the real capture does: gradients exist before it
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grad_buffers = tuple(p.grad for p in params)
        live = {}

        def forward():
            with torch.enable_grad(), autocast():
                live["out"] = module(sample)
            for buf, o in zip(static_out, live["out"]):
                buf.copy_(o.detach())

        def backward():  # what the captured backward does: add into the captured gradient tensors
            grads = torch.autograd.grad(live.pop("out"), params, static_grad_out)
            with torch.no_grad():
                for buf, g in zip(grad_buffers, grads):
                    buf.add_(g)

        shape = CapturedShape(module=module, params=params, autocast=autocast, on_error=on_error,
                              forward_graph=EmulatedGraph(forward), backward_graph=EmulatedGraph(backward),
                              static_input=sample, static_outputs=static_out,
                              static_grad_outputs=static_grad_out, grad_buffers=grad_buffers)
        self.shapes.append(shape)
        return shape

    def release(self):
        pass


def test_replayed_gradients_accumulate_across_micro_batches():
    # The backward graph adds into the gradient tensors captured with it; clearing `.grad`
    # between optimizer steps (set_to_none) must not lose that link.
    backend = EmulatedBackend()
    manager, ref = pair(backend)
    steps_match(manager, ref, range(3))
    for module in (manager.module, ref):  # an optimizer update: zero_grad(set_to_none=True)
        module.zero_grad(set_to_none=True)
    steps_match(manager, ref, range(3, 7))  # four replayed micro-batches accumulate into fresh .grad
    assert manager.stats()["replayed_steps"] == 5
    assert_same(grads(manager.module), grads(ref), atol=1e-5)
    assert_same(list(manager.module.buffers()), list(ref.buffers()))
    captured = backend.shapes[0].grad_buffers
    assert all(p.grad is g for p, g in zip(manager.module.parameters(), captured))


def test_a_replaced_gradient_is_taken_back_with_its_values():
    backend = EmulatedBackend()
    manager, ref = pair(backend)
    steps_match(manager, ref, range(3))
    for module in (manager.module, ref):  # something swaps in new gradient tensors, values kept
        for p in module.parameters():
            p.grad = p.grad.clone()
    x = images(seed=3)
    assert_same(step(manager, x), step(ref, x))
    assert_same(grads(manager.module), grads(ref), atol=1e-5)
    assert all(p.grad is g for p, g in zip(manager.module.parameters(), backend.shapes[0].grad_buffers))


def test_failed_backward_replay_recomputes_eagerly_once(libreyolo_log):
    backend = EmulatedBackend()
    manager, ref = pair(backend)
    for i in range(3):
        step(manager, images(seed=i))
        step(ref, images(seed=i))
    backend.shapes[0].backward_graph.fail = True
    steps_match(manager, ref, range(3, 6))
    assert_same(grads(manager.module), grads(ref), atol=1e-5)
    assert_same(list(manager.module.buffers()), list(ref.buffers()))  # BN stats updated once per step
    msgs = lines(libreyolo_log)
    assert len(msgs) == 2 and msgs[1].startswith("CUDA graph backward replay failed: RuntimeError: planted")
    # Step 4's forward was a replay (its backward failed); steps 5 and 6 ran eager.
    assert manager.stats()["replayed_steps"] == 2 and manager.stats()["eager_steps"] == 4
    assert not manager.enabled


def test_a_second_forward_before_the_backward_runs_eager():
    backend = EmulatedBackend()
    manager, ref = pair(backend)
    for i in range(3):
        step(manager, images(seed=i))
        step(ref, images(seed=i))
    a, b = images(seed=10), images(seed=11)
    out_a, out_b = manager(a), manager(b)  # b must not overwrite a's saved activations
    (loss_of(out_a) + loss_of(out_b)).backward()
    (loss_of(ref(a)) + loss_of(ref(b))).backward()
    assert_same(grads(manager.module), grads(ref), atol=1e-5)
    assert manager.stats()["replayed_steps"] == 2 and manager.stats()["eager_steps"] == 3
    step(manager, images())  # the pending node is gone: replays again
    assert manager.stats()["replayed_steps"] == 3


def test_forward_replay_failure_with_the_real_node_falls_back(libreyolo_log):
    backend = EmulatedBackend()
    manager, ref = pair(backend)
    steps_match(manager, ref, range(3))
    backend.shapes[0].forward_graph.fail = True
    x = images(seed=3)
    assert_same(step(manager, x), step(ref, x))
    assert_same(grads(manager.module), grads(ref), atol=1e-5)
    assert len(lines(libreyolo_log)) == 2 and not manager.enabled


def test_describe_key_names_layout():
    x = images().contiguous(memory_format=torch.channels_last)
    assert graphs.describe_key(input_key(x)) == "2x3x8x8 float32 channels_last"
    assert graphs.describe_key(input_key(images().half())) == "2x3x8x8 float16"


# --- the real capture sequence, with torch.cuda's stream/graph calls stubbed --------------------
class StubStream:
    def wait_stream(self, other):
        pass


class StubGraph:
    def __init__(self):
        self.token = object()

    def pool(self):
        return self.token

    def replay(self):
        raise AssertionError("not replayed in this test")


@pytest.fixture
def stub_cuda(monkeypatch):
    """Enough of torch.cuda for CudaGraphBackend.capture to run its sequence eagerly on CPU."""
    calls = {"graphs": [], "set_stream": [], "reserved": iter([100 * 2**20, 164 * 2**20])}
    caller = StubStream()

    class StubCapture:
        def __init__(self, graph, pool=None, stream=None, capture_error_mode="global"):
            calls["graphs"].append({"graph": graph, "pool": pool, "stream": stream, "mode": capture_error_mode,
                                    "gc_enabled": graphs.gc.isenabled()})

        def __enter__(self):
            calls["capturing"] = True

        def __exit__(self, *exc):
            calls["capturing"] = False

    cuda = torch.cuda
    monkeypatch.setattr(cuda, "Stream", lambda device=None: StubStream())
    monkeypatch.setattr(cuda, "current_stream", lambda device=None: caller)
    monkeypatch.setattr(cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(cuda, "set_stream", lambda s: calls["set_stream"].append(s))
    monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(cuda, "memory_reserved", lambda device=None: next(calls["reserved"]))
    monkeypatch.setattr(cuda, "CUDAGraph", StubGraph)
    monkeypatch.setattr(cuda, "graph", StubCapture)
    calls["caller"] = caller
    return calls


def test_real_capture_sequence_restores_buffers_and_builds_static_state(stub_cuda):
    torch.manual_seed(0)
    module = Tiny().train()
    before = [b.clone() for b in module.buffers()]
    sample = images()
    shape = graphs.CudaGraphBackend().capture(module, sample, contextlib.nullcontext, lambda *a: None)
    # Warm-up and capture ran forward 4 times in train mode; the BN stats are as they were.
    assert_same(list(module.buffers()), before)
    fwd, bwd = stub_cuda["graphs"]
    assert fwd["mode"] == bwd["mode"] == "thread_local" and fwd["stream"] is bwd["stream"]
    assert fwd["pool"] is None and bwd["pool"] is shape.forward_graph.token  # one pool per shape
    assert not fwd["gc_enabled"] and graphs.gc.isenabled()
    assert shape.static_input is sample and shape.pool_mb == 64.0
    assert [o.shape for o in shape.static_outputs] == [o.shape for o in module(sample)]
    assert not any(o.requires_grad for o in shape.static_outputs)
    # The gradients exist before the capture, and the graph accumulates into exactly those.
    assert [id(g) for g in shape.grad_buffers] == [id(p.grad) for p in module.parameters()]
    assert stub_cuda["set_stream"] == [stub_cuda["caller"]]


def test_real_capture_failure_restores_stream_gc_and_buffers(stub_cuda):
    torch.manual_seed(0)
    module = Tiny().train()
    before = [b.clone() for b in module.buffers()]

    def sync_inside_capture(mod, args, out):
        if stub_cuda.get("capturing"):
            raise RuntimeError("operation not permitted when stream is capturing")

    module.head.register_forward_hook(sync_inside_capture)
    with pytest.raises(RuntimeError, match="stream is capturing"):
        graphs.CudaGraphBackend().capture(module, images(), contextlib.nullcontext, lambda *a: None)
    assert stub_cuda["set_stream"] == [stub_cuda["caller"]] and graphs.gc.isenabled()
    assert_same(list(module.buffers()), before)


def test_capturable_must_return_a_tuple(stub_cuda):
    with pytest.raises(TypeError, match="tuple of tensors"):
        graphs.CudaGraphBackend().capture(nn.Conv2d(3, 2, 1), images(), contextlib.nullcontext, lambda *a: None)


def test_multi_scale_meets_graphs_with_one_line(libreyolo_log):
    manager = GraphManager.for_run(MODEL, SimpleNamespace(cuda_graph=True, multi_scale=True), FAMILY, CUDA,
                                   PRECISION, backend=FakeBackend())
    assert manager.enabled
    [line] = lines(libreyolo_log)
    assert line.startswith("cuda_graph=true with multi_scale=true:") and "multi_scale=false" in line
    assert f"fewer than {CAPTURE_AFTER} times" in line


def test_a_models_graph_note_is_logged_once_at_the_first_capture(libreyolo_log):
    """`model.graph_note` (families/base.py): said once, after the capture line, and not again when
    an invalidation re-captures."""
    model = SimpleNamespace(capturable=Tiny().train(), graph_note="drop-path replays its own random stream")
    manager = GraphManager.for_run(model, SimpleNamespace(cuda_graph=True), FAMILY, CUDA, PRECISION,
                                   backend=FakeBackend())
    for i in range(CAPTURE_AFTER + 1):
        step(manager, images(seed=i))
    manager.invalidate("a planted change")
    for i in range(CAPTURE_AFTER + 1):
        step(manager, images(seed=i))
    said = lines(libreyolo_log)
    assert [s for s in said if "drop-path" in s] == ["CUDA graphs: drop-path replays its own random stream"]
    assert said.index("CUDA graphs: drop-path replays its own random stream") == 1  # right after the first capture
    assert sum(s.startswith("CUDA graph captured") for s in said) == 2
