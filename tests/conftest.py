import os

import pytest


# Every test writes its generated datasets and downloads under a per-session temp dir, never ~.
@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    if "LIBREYOLO_CACHE" not in os.environ:
        os.environ["LIBREYOLO_CACHE"] = str(tmp_path_factory.mktemp("libreyolo_cache"))
    yield


def pytest_collection_modifyitems(config, items):
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
