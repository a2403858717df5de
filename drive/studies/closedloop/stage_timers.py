"""Wall-clock timers around named functions for the length of a `with` block: where a step's time goes, stage by stage.

A stage is (depth, label, module, attribute path), e.g. ``(1, "PPO expert", "agents.experts.ppo",
"PPOExpert.act_many")``: inside `stage_timers(stages)` that function is replaced by one that adds its wall time in ns
to `spent[i]`, and the original is put back on leaving (an exception included). Depth is only for printing: a nested
stage's time is also in its parent's. Callers look the function up where the patch lands (a class attribute, or a
module global read at call time); a reference taken earlier (a bound method kept in a list, a name imported into
another module) is not timed. Each timed call costs ~0.3 us of `perf_counter_ns` and one more Python call.

Used by `drive bench render --breakdown` (the env's step) and `drive bench closedloop` (collect's and eval's steps:
drive/studies/closedloop/stages.py).
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

Stage = tuple[int, str, str, str]  # (depth, label, module, attribute path within it)


def _owner(module: str, attr: str) -> tuple[Any, str]:
    owner: Any = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    if not callable(owner.__dict__.get(name)) or isinstance(owner.__dict__[name], type):
        raise TypeError(f"stage {module}.{attr}: not a plain function in {owner!r}'s own namespace")
    return owner, name


@contextmanager
def stage_timers(stages: Sequence[Stage]) -> Iterator[list[int]]:
    """Time every stage's function while the block runs; yields `spent`, ns per stage, which the block may reset."""
    spent = [0] * len(stages)
    patched: list[tuple[Any, str, Callable]] = []

    def timer(i: int, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[i] += time.perf_counter_ns() - t0

        return timed

    try:
        for i, (_, _, module, attr) in enumerate(stages):
            owner, name = _owner(module, attr)
            patched.append((owner, name, owner.__dict__[name]))
            setattr(owner, name, timer(i, owner.__dict__[name]))
        yield spent
    finally:
        for owner, name, fn in reversed(patched):
            setattr(owner, name, fn)
