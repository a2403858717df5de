"""drive/studies/closedloop/stages.py: a stage's function timed inside the block, nested time inside its parent,
the originals back afterwards (an exception included), and a name that is not a plain function refused."""

from __future__ import annotations

import sys
import time
import types

import pytest

from drive.studies.closedloop.stages import stage_timers


@pytest.fixture()
def module(monkeypatch):
    mod = types.ModuleType("stage_timers_subject")

    class Worker:
        def outer(self) -> int:
            time.sleep(0.002)
            return mod.inner() + 1  # a module global, read at call time

    def inner() -> int:
        time.sleep(0.003)
        return 41

    mod.Worker, mod.inner = Worker, inner
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod


STAGES = ((0, "outer", "stage_timers_subject", "Worker.outer"), (1, "inner", "stage_timers_subject", "inner"))


def test_stages_are_timed_nested_and_restored(module):
    outer, inner = module.Worker.__dict__["outer"], module.inner
    with stage_timers(STAGES) as spent:
        assert module.Worker().outer() == 42 and module.Worker().outer() == 42
    assert spent[1] >= 2 * 3e6 and spent[0] >= spent[1] + 2 * 2e6  # ns: the inner sleeps within the outer's
    assert module.Worker.__dict__["outer"] is outer and module.inner is inner


def test_the_originals_come_back_after_an_exception(module):
    inner = module.inner
    with pytest.raises(RuntimeError), stage_timers(STAGES):
        raise RuntimeError("halfway")
    assert module.inner is inner


def test_a_stage_that_is_not_a_plain_function_is_refused_and_nothing_stays_patched(module):
    module.CONSTANT = 3
    inner = module.inner
    bad = ((1, "inner", "stage_timers_subject", "inner"), (0, "no function", "stage_timers_subject", "CONSTANT"))
    with pytest.raises(TypeError, match="not a plain function"), stage_timers(bad):
        pass
    assert module.inner is inner
