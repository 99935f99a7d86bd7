"""Test-wide defaults: the user tier is off so a developer's tuning never changes what a test sees."""
import os

os.environ.setdefault("TUNEDB_USER_DB", "off")


def pytest_collection_modifyitems(config, items):
    import pytest

    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # torch missing or broken: GPU tests cannot run
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
