"""Test-wide defaults: the user tier is off so a developer's tuning never changes what a test sees."""
import os

import pytest

os.environ.setdefault("TUNEDB_USER_DB", "off")


@pytest.fixture
def tiers_dirs(tmp_path):
    """An empty system tier and a user tier in tmp_path (yielded); the arch is detected afresh
    (sm90's shipped profile without a GPU) and the launch table cleared, before and after."""
    from tunedb import settings
    from tunedb.runtime import selector
    from tunedb.database import tiers
    from tunedb.runtime import launch_table

    system, user = tmp_path / "system", tmp_path / "user"
    system.mkdir()
    user.mkdir()
    with settings.override(USER_DB=str(user)), tiers.system_root_override(system):
        selector.configure()
        launch_table.clear()
        yield user
    selector.configure()
    launch_table.clear()


def pytest_collection_modifyitems(config, items):
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


@pytest.fixture
def swap_unmeasured(monkeypatch):
    """optimize() swaps the Linears of keys no table measured (TUNEDB_LEAVE_UNMEASURED=0): for the
    tests whose rules act on swapped layers (fusion, autocast, the host path); by default such a
    model is left as written (tests/unit/test_left_as_written.py)."""
    monkeypatch.setenv("TUNEDB_LEAVE_UNMEASURED", "0")
