"""The closed loop's process heap: frozen once, before the first episodes, out of the garbage collector's reach."""

from __future__ import annotations

import gc

_FROZEN = False  # `freeze_heap` done in this process


def freeze_heap() -> None:
    """Once per process, before its first episodes: collect garbage, then move every object still alive to the
    garbage collector's permanent generation (`gc.freeze`), so no later full collection traverses them: before,
    every full collection walked all of start-up's objects (torch's, numba's, gymnasium's, the models').
    Forked workers inherit the frozen heap and no longer write to every inherited object's GC header (pages copied on
    write), which is what CPython's documentation of `gc.freeze` recommends before a fork. Objects alive now that
    later become cyclic garbage are not reclaimed: they live as long as the process anyway. `drive bench closedloop`
    prints how many objects were frozen and the collector's time per step and longest pause beside its stages
    (drive/studies/closedloop/stages.py). Called by drive/loop/pool.py `run_tasks` before its first tasks."""
    global _FROZEN
    if not _FROZEN:
        _FROZEN = True
        gc.collect()
        gc.freeze()
