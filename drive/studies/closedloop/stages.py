"""Where a step of `drive collect` and of `drive eval` goes: each run once more, on 1 worker in this process, with
wall-clock timers around its stages (`stage_timers`, below), in microseconds per car-step.

`drive bench closedloop` prints these after its rows. The env's share (`TimeLimit.step` and `.reset`: the bare env's
whole step, wrappers included, as its env rows time it) is what a loop cannot shed; the rest is the loop's own work,
set beside what a target ratio leaves it: at 0.9x (collect) or 0.8x (eval) of the env alone, a step may spend
env x (1 / target - 1) on everything else. Measured against this loop's own env time, which may differ from the env
row's (other tracks for eval, caches shared with the controller), so it says where the time goes, not the ratio.
Nested stages are part of their parent's figure; "the rest" is the loop's wall time less its top-level stages: the
loop's own Python (run_lanes, step records, observers' calls), start-up and the timers themselves (~0.3 us a call).

Wall-clock timers around named functions for the length of a `with` block: where a step's time goes, stage by stage.

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
import gc
import importlib
import resource
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from drive.studies.closedloop.loops import LoopRowsConfig, collect_run, eval_row

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


# -- the loop's stages ----------------------------------------------------------------------------------------------
_ENV: tuple[Stage, ...] = (
    (0, "env step (wrappers included)", "gymnasium.wrappers", "TimeLimit.step"),
    (0, "env reset (a new track)", "gymnasium.wrappers", "TimeLimit.reset"),
)
COLLECT_STAGES: tuple[Stage, ...] = (
    *_ENV,
    (0, "expert's action and DART noise", "drive.loop.collect", "act_lanes"),
    (1, "PPO expert (numba kernels)", "agents.experts.ppo", "PPOExpert.act_many"),
    (0, "recorder, per step", "drive.observe.demonstrations", "EpisodeRecorder.__call__"),
    (1, "frame coding to 84x84 gray", "datasets.frames", "area_gray"),
    (0, "episode arrays, per episode", "drive.observe.demonstrations", "EpisodeRecorder.arrays"),
    (0, "shard: deflate and write, per episode", "drive.loop.collect", "write_episode"),
)
EVAL_STAGES: tuple[Stage, ...] = (
    *_ENV,
    (0, "the K cars' step (one controller call)", "drive.loop.evaluate", "act_lanes"),
    (1, "controller call", "drive.loop.lanes", "predict_lanes"),
    (2, "frame coding into the stacks", "datasets.frames", "ObservationCoder.push_into"),
    (2, "network, S samples", "agents.base", "Controller.predict"),
    (3, "encoder: the new frames' tokens", "agents.encoders", "FrameTokens.forward"),
    (1, "shadow experts (one car: in its decision)", "drive.loop.lanes", "expert_lanes"),
    (1, "each car's decision (gate, statistics)", "drive.loop.policies", "ControllerPolicy.decide"),
)
TARGETS = {"collect": 0.9, "eval": 0.8}


def split(
    stages: tuple[Stage, ...], spent: list[int], steps: int, wall_s: float, target: float, counters: list[int]
) -> dict[str, Any]:
    """Per-step microseconds of each stage, the rest, the env's share, what `target` leaves the loop, and the garbage
    collector's time (already inside the stages it interrupted)."""
    rows: list[dict[str, Any]] = [
        {"depth": depth, "label": label, "us_per_step": ns / steps / 1e3}
        for (depth, label, _, _), ns in zip(stages, spent, strict=True)
    ]
    total = wall_s * 1e6 / steps
    top = sum(row["us_per_step"] for row in rows if row["depth"] == 0)
    rows.append({"depth": 0, "label": "the rest: the loop's own Python, start-up, timers", "us_per_step": total - top})
    env = sum(row["us_per_step"] for row in rows[: len(_ENV)])
    gc_ns, gc_longest, gc_full, faults = counters
    return {
        "steps": steps,
        "us_per_step": total,
        "stages": rows,
        "env_us": env,
        "over_env_us": total - env,
        "target": target,
        "allowed_over_env_us": env * (1 / target - 1),
        "garbage_collector_us": gc_ns / steps / 1e3,
        "garbage_collector_longest_ms": gc_longest / 1e6,
        "garbage_collector_full_runs": gc_full,
        "objects_frozen": gc.get_freeze_count(),
        "page_faults_per_step": faults / steps,
    }


@contextmanager
def heap_counters() -> Iterator[list[int]]:
    """Python's cyclic garbage collector while the block runs (`gc.callbacks`), in whatever stage, and the process's
    minor page faults: [the collector's wall ns in all, its longest collection in ns, full (generation 2)
    collections, page faults]. Faults are memory touched for the first time, or again after the allocator gave it
    back to the kernel (torch's freed blocks of a batched call): what the figure shows, start-up included."""
    spent, started = [0, 0, 0, 0], [0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter_ns()
        else:
            took = time.perf_counter_ns() - started[0]
            spent[0] += took
            spent[1] = max(spent[1], took)
            spent[2] += info["generation"] == 2

    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    gc.callbacks.append(callback)
    try:
        yield spent
    finally:
        gc.callbacks.remove(callback)
        spent[3] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def loop_stages(cfg: LoopRowsConfig, k: int) -> dict[str, dict[str, Any]]:
    """Collect (`--envs 0`, 1 worker) and eval (K cars, 1 worker), each once, timed stage by stage."""
    out = {}
    with stage_timers(COLLECT_STAGES) as spent, heap_counters() as counters:
        steps, wall, _ = collect_run(cfg, 1)
    out["collect"] = split(COLLECT_STAGES, list(spent), steps, wall, TARGETS["collect"], counters)
    with stage_timers(EVAL_STAGES) as spent, heap_counters() as counters:
        row = eval_row(cfg, k, 1)
    out["eval"] = split(EVAL_STAGES, list(spent), row.steps, row.wall_s, TARGETS["eval"], counters)
    return out


def timed_stages(cfg: LoopRowsConfig, k: int, console: Any) -> dict[str, dict[str, Any]]:
    """`loop_stages` under a status line, then its tables printed (what `drive bench closedloop` runs last)."""
    with console.status("timing collect's and eval's steps stage by stage ..."):
        stages = loop_stages(cfg, k)
    print_stages(console, stages, k)
    return stages


def print_stages(console: Any, stages: dict[str, dict[str, Any]], k: int) -> None:
    from rich.table import Table

    for loop, got in stages.items():
        name = "drive collect, 1 car" if loop == "collect" else f"drive eval, K={k} cars"
        table = Table(title=f"where a step of {name} goes (wall us per car-step, {got['steps']} steps)")
        for col in ("stage", "us", "share"):
            table.add_column(col, justify="left" if col == "stage" else "right")
        for row in got["stages"]:
            table.add_row(
                "  " * row["depth"] + row["label"],
                f"{row['us_per_step']:.1f}",
                f"{100 * row['us_per_step'] / got['us_per_step']:.1f} %",
            )
        table.add_row("whole step", f"{got['us_per_step']:.1f}", "100 %")
        console.print(table)
        console.print(
            f"{loop}: {got['over_env_us']:.1f} us per step over the env's {got['env_us']:.1f}; at "
            f"{got['target']}x the env alone a step may spend {got['allowed_over_env_us']:.1f}. Python's "
            f"garbage collector: {got['garbage_collector_us']:.2f} us per step inside the stages above, "
            f"{got['garbage_collector_full_runs']} full runs, the longest pause "
            f"{got['garbage_collector_longest_ms']:.1f} ms; {got['objects_frozen']} objects frozen at "
            f"start-up (drive/loop/heap.py freeze_heap); {got['page_faults_per_step']:.1f} page faults "
            "per step, start-up included"
        )
