"""Time and peak memory of a callable, the one way the benchmarks measure them.

    time_it(fn, device, warmup, repeats) -> {"wall_ms", "cpu_ms"}   medians; CUDA synchronised
    peak_bytes(fn, device) -> int

Memory: on CPU, torch.profiler with profile_memory=True records every allocation of the CPU allocator with the
running total of bytes allocated inside the profiled region; the peak of that total while fn() runs (inputs and
parameters excluded: they exist before) is reported. On CUDA: torch.cuda.max_memory_allocated above the
level before the step. The CPU profiler's own chatter on stderr (USDT profiler_start/stop lines, the CPUAllocator
warning about blocks allocated before profiling) is dropped; every other stderr line of that window is passed on.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_it(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> dict[str, float]:
    """Median wall and CPU milliseconds of fn() over `repeats` runs after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    _sync(device)
    walls, cpus = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        _sync(device)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {"wall_ms": 1e3 * statistics.median(walls), "cpu_ms": 1e3 * statistics.median(cpus)}


#: what torch's CPU profiler writes to fd 2 itself (C++, not Python warnings) on every start/stop
_PROFILER_CHATTER = re.compile(r"profiler_(start|stop)\b|Memory block of unknown size was allocated before")


@contextmanager
def without_profiler_chatter() -> Iterator[None]:
    """Capture fd 2 (C++ writes there directly) for the block, then pass on every line that is not profiler chatter."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(True)
            sys.stderr.write("".join(line for line in lines if not _PROFILER_CHATTER.search(line)))
            sys.stderr.flush()


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated while fn() runs, above what was allocated before (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with without_profiler_chatter():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        events = list(prof.profiler.kineto_results.experimental_event_tree())
    peak, stack = 0, events
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            peak = max(peak, event.extra_fields.total_allocated)
        stack.extend(event.children)
    return peak
