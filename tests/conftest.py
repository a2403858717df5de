"""Shared fixtures. Real data lives in ../shared/data beside the checkout (or $DRIVE_DATA_ROOT).

A test that needs it skips with a clear message in a user's clone without it; under CI (CI=true) the data is
guaranteed to be there, so its absence is a failure, not a skip.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DRIVE_DATA_ROOT", REPO.parent / "shared" / "data"))

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

# A shell without job control starts background commands with SIGINT ignored, and the commands rightly keep it so
# (drive/loop/pool.py DeferredInterrupt); the Ctrl-C tests check what an interactive user gets, so the suite runs
# with Python's default handler, which processes it starts inherit as the default action.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def shared_data():
    """Path to the real public data; `shared_data / "udacity_sim"` etc."""
    if not SHARED_DATA.is_dir():
        msg = f"real data not found at {SHARED_DATA} (set DRIVE_DATA_ROOT or place shared/data beside the checkout)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return SHARED_DATA


@pytest.fixture
def one_thread():
    """torch on one intra-op thread for the test (2 shared cores: more threads only add contention for small
    tensors); the previous setting is restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


SLOW_TIMEOUT_S = 1800  # a `slow` test (a closed-loop or training run) gets this instead of the default 60 s


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test stops at pyproject's 60 s unless it says otherwise; `slow` tests are allowed SLOW_TIMEOUT_S."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
