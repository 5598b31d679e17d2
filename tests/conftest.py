import os

import pytest

# Subprocesses (the `libreyolo` command, bench workers) run this tree's code, whatever copy of
# libreyolo is pip-installed; in-process imports get the same through pytest's `pythonpath`.
_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_SRC, os.environ.get("PYTHONPATH")) if p)


# Under pytest-xdist (`make test` runs a worker per core) each worker takes its share of the cores
# for torch's intra-op threads, so two workers on two cores do not run four threads.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


# Every test writes its generated datasets and downloads under a per-run temp dir, never ~. And
# no test downloads published weights (ECDet's training fetches its ViT's by default): the
# weights URL is a closed local port unless a test serves its own (test_model_names.py).
@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    if "LIBREYOLO_CACHE" not in os.environ:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            # One cache for the run's workers (their basetemps share this run's folder): the built-in
            # sets are generated once, not once a worker (shapes alone takes 3-4 s). Generation is
            # safe to race (data/shapes.ensure_generated: a temp folder, the first rename wins); the
            # tests that look at a cache's contents set their own LIBREYOLO_CACHE.
            cache = tmp_path_factory.getbasetemp().parent / "libreyolo_cache"
            cache.mkdir(exist_ok=True)
        else:
            cache = tmp_path_factory.mktemp("libreyolo_cache")
        os.environ["LIBREYOLO_CACHE"] = str(cache)
    os.environ.setdefault("LIBREYOLO_WEIGHTS_URL", "http://127.0.0.1:9/weights")
    yield


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a busy 2-core runner OpenMP's
    waiting threads made a 64 px forward take seconds instead of milliseconds (measured)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Unit modules whose tests train or export for seconds each, run before the other unit modules:
# pytest-xdist hands out consecutive tests in chunks, so a module of long tests left at the end
# of the collection (test_trainer.py is) finishes on one worker while the other idles (12 s of
# a 390 s run measured). Only the order changes; a module missing here keeps its place.
LONG_UNIT_MODULES = ("test_trainer.py", "test_profiler_window.py", "test_distributed.py", "test_loggers.py",
                     "test_segmenters.py", "test_classifiers.py")


def _long_first(item) -> int:
    path = item.path
    return 0 if path.parent.name == "unit" and path.name in LONG_UNIT_MODULES else 1


def pytest_collection_modifyitems(config, items):
    if any(_long_first(item) == 0 for item in items):
        first = [i for i in items if i.path.parent.name != "unit"]  # cli/ (and the rest) keep their place at the front
        unit = [i for i in items if i.path.parent.name == "unit"]
        items[:] = first + sorted(unit, key=_long_first)  # stable: each module's order kept
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
