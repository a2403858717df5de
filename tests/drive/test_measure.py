"""drive/measure.py: the benchmarks' one way to time a callable and take its peak memory."""

from __future__ import annotations

import os

import torch

from drive.measure import peak_bytes, time_it, without_profiler_chatter


def test_time_it_runs_warmup_plus_repeats_and_reports_medians():
    calls = []
    timing = time_it(lambda: calls.append(sum(range(20_000))), torch.device("cpu"), warmup=2, repeats=5)
    assert len(calls) == 7 and timing["wall_ms"] > 0 and timing["cpu_ms"] >= 0


def test_peak_bytes_sees_what_the_callable_allocates():
    # the CPU profiler counts every allocation of the process in the window: in a full test run ~0.8 MiB more showed up
    small = peak_bytes(lambda: torch.empty(1 << 10), torch.device("cpu"))
    big = peak_bytes(lambda: torch.empty(1 << 20) + 1, torch.device("cpu"))  # two 4 MiB tensors at once
    assert 8 << 20 <= big < 12 << 20 and small < 2 << 20 and big - small > 6 << 20


def test_bench_drops_only_the_profilers_stderr_chatter(capfd):
    with without_profiler_chatter():
        os.write(2, b"USDT:2026-11-29 22:47:43 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"[W1129 CPUAllocator.cpp:245] Memory block of unknown size was allocated before the profiling\n")
        os.write(2, b"RuntimeError: a real problem\n")
    err = capfd.readouterr().err
    assert err == "RuntimeError: a real problem\n"
