"""Fault injection: every test here counts what it tried (kill points, corruptions) and what went wrong (lost or
duplicated episodes, accepted corrupt files); the totals are printed at the end of the run."""

from __future__ import annotations

from collections import Counter

import pytest

TALLY: Counter = Counter()


@pytest.fixture
def tally() -> Counter:
    return TALLY


def pytest_terminal_summary(terminalreporter):
    if TALLY:
        keys = ("kill_points", "corruptions", "lost_episodes", "duplicated_episodes", "accepted_corrupt_files")
        line = ", ".join(f"{k.replace('_', ' ')} {TALLY.get(k, 0)}" for k in keys)
        terminalreporter.write_sep("-", f"fault injection: {line}")
