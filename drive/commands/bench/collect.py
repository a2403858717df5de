"""`drive bench collect`: frames/s of the stock CarRacing loop, the fast-renderer loop and `drive collect` (1 and 2
workers), measured in one run and printed side by side with the ratios the foundation issue targets:

    collect (1 worker) >= 0.9x the fast-renderer loop with the same expert, and >= 1.8x the stock loop
    collect (2 workers) >= 1.7x collect (1 worker)

The stock loop is gymnasium's CarRacing-v3 (pygame renderer) under random actions, the way a user would drive it
without our bridge. The fast loops drive our pixel bridge (84x84 frame stack) with random actions and with the same
expert `drive collect` uses, so "collect / fast (expert)" is the cost of recording alone: stacking, copying,
compressing and writing shards. Collect rates count the whole run (worker start-up included) over all frames.
A benchmark, not a test: the figures depend on the machine and on what else runs on it, so frames per CPU-second
are printed beside frames/s (on a busy machine the wall-clock ratios mostly measure the neighbours).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from datasets.files import atomic_write
from drive.loop.options import CollectOptions
from drive.options import NonNegativeInt, PositiveInt

TARGETS = {"collect1_over_fast_expert": 0.9, "collect1_over_stock": 1.8, "collect2_over_collect1": 1.7}


@dataclass(frozen=True)
class Config:
    out: Path | None = None
    """results JSON file; default: print only"""
    steps: PositiveInt = 2000
    """env steps timed per loop benchmark (stock, fast random, fast expert)"""
    episodes: PositiveInt = 6
    """episodes per collect run (1 worker, then 2 workers); even, so two workers share them equally"""
    first_seed: NonNegativeInt = 5000
    """track seeds of the collect runs: first_seed .. first_seed + episodes - 1"""
    expert: str = "ppo"
    """expert that drives the fast-expert loop and the collect runs"""
    max_episode_steps: PositiveInt = 1000
    """step limit per episode"""


def _loop(env, n_steps: int, act, first_seed: int) -> tuple[int, float]:
    """(frames, wall seconds) of a plain reset/step loop on tracks first_seed, first_seed + 1, ...; act(obs, info).
    Every loop and the collect runs drive the same tracks: a frame's render cost depends on the track."""
    obs, info = env.reset(seed=first_seed)
    seed, start = first_seed, time.perf_counter()
    for _ in range(n_steps):
        obs, _, terminated, truncated, info = env.step(act(obs, info))
        if terminated or truncated:
            seed += 1
            obs, info = env.reset(seed=seed)
    return n_steps, time.perf_counter() - start


def stock_loop(n_steps: int, first_seed: int) -> tuple[int, float]:
    import gymnasium as gym

    env = gym.make("CarRacing-v3")
    env.action_space.seed(0)
    try:
        return _loop(env, n_steps, lambda obs, info: env.action_space.sample(), first_seed)
    finally:
        env.close()


def fast_loop(n_steps: int, expert: str | None, max_episode_steps: int, first_seed: int) -> tuple[int, float]:
    from drive.loop.specs import expert_policy
    from sim_bridges.carracing.bridge import make_carracing

    env = make_carracing(mode="pixels", fast_render=True, max_episode_steps=max_episode_steps)
    try:
        if expert is None:
            env.action_space.seed(0)
            return _loop(env, n_steps, lambda obs, info: env.action_space.sample(), first_seed)
        policy = expert_policy(expert)
        policy.reset()
        return _loop(env, n_steps, policy.act, first_seed)
    finally:
        env.close()


def collect_run(workers: int, cfg: Config) -> tuple[int, float]:
    from drive.loop.collect import collect
    from drive.observe.demonstrations import recorder_for

    with tempfile.TemporaryDirectory(prefix="bench_collect_") as tmp:
        options = CollectOptions(
            out=Path(tmp),
            expert=cfg.expert,
            episodes=cfg.episodes,
            seeds=f"{cfg.first_seed}-{cfg.first_seed + cfg.episodes - 1}",
            workers=workers,
            max_episode_steps=cfg.max_episode_steps,
            progress=False,
        )
        summary = collect(options, recorder_for)
        return summary.frames, summary.seconds


def _cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children (the pool's workers, once joined)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure_all(cfg: Config, console) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    """frames/s and frames per CPU-second of every loop, and their labels."""
    fps: dict[str, float] = {}
    per_cpu: dict[str, float] = {}  # frames per CPU-second: what the loop costs, whatever else runs on the machine
    n, limit, s0 = cfg.steps, cfg.max_episode_steps, cfg.first_seed
    plan = [
        ("stock", "stock CarRacing-v3, random actions", lambda: stock_loop(n, s0)),
        ("fast_random", "fast renderer bridge, random actions", lambda: fast_loop(n, None, limit, s0)),
        ("fast_expert", f"fast renderer bridge, {cfg.expert} expert", lambda: fast_loop(n, cfg.expert, limit, s0)),
        ("collect1", f"drive collect, {cfg.expert}, 1 worker", lambda: collect_run(1, cfg)),
        ("collect2", f"drive collect, {cfg.expert}, 2 workers", lambda: collect_run(2, cfg)),
    ]
    # collect runs first, 2 workers first: like the CLI, this process then holds no torch yet, so the pool forks
    # (the in-process 1-worker run and the expert loop load the torch expert here)
    for key, label, measure in [plan[4], plan[3], *plan[:3]]:
        with console.status(f"measuring {label} ..."):
            cpu = _cpu_seconds()
            frames, seconds = measure()
            cpu = _cpu_seconds() - cpu
        fps[key], per_cpu[key] = frames / seconds, frames / cpu
        console.print(f"{label}: {fps[key]:.0f} frames/s ({per_cpu[key]:.0f} per CPU-second)")
    order = [key for key, _, _ in plan]
    return {k: fps[k] for k in order}, {k: per_cpu[k] for k in order}, {key: label for key, label, _ in plan}


def print_tables(console, fps: dict, per_cpu: dict, labels: dict, ratios: dict) -> None:
    from rich.table import Table

    table = Table(title="frames/s")
    for col in ("loop", "frames/s", "frames per CPU-s"):
        table.add_column(col, justify="left" if col == "loop" else "right")
    for key, value in fps.items():
        table.add_row(labels[key], f"{value:.0f}", f"{per_cpu[key]:.0f}")
    console.print(table)
    checks = Table(title="ratios")
    for col in ("ratio", "measured", "target", ""):
        checks.add_column(col, justify="right" if col else "left")
    for key, value in ratios.items():
        target = TARGETS.get(key)
        verdict = "" if target is None else ("met" if value >= target else "MISSED")
        checks.add_row(key, f"{value:.2f}x", "-" if target is None else f">= {target}x", verdict)
    console.print(checks)


def run(cfg: Config) -> int:
    from rich.console import Console

    console = Console()
    load_before = os.getloadavg()[0]
    fps, per_cpu, labels = measure_all(cfg, console)
    ratios = {
        "collect1_over_fast_expert": fps["collect1"] / fps["fast_expert"],
        "collect1_over_fast_random": fps["collect1"] / fps["fast_random"],
        "collect1_over_stock": fps["collect1"] / fps["stock"],
        "fast_random_over_stock": fps["fast_random"] / fps["stock"],
        "collect2_over_collect1": fps["collect2"] / fps["collect1"],
        # parallel efficiency: 1.0 means the two workers spend no extra CPU per frame (start-up, contention)
        "collect2_over_collect1_per_cpu": per_cpu["collect2"] / per_cpu["collect1"],
    }
    print_tables(console, fps, per_cpu, labels, ratios)
    machine = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg_1m_before": load_before,
        "load_avg_1m_after": os.getloadavg()[0],
        "numpy": np.__version__,
    }
    results = {
        "frames_per_s": fps,
        "frames_per_cpu_s": per_cpu,
        "ratios": ratios,
        "targets": TARGETS,
        "met": {key: ratios[key] >= target for key, target in TARGETS.items()},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()},
        "machine": machine,
    }
    if cfg.out is not None:
        atomic_write(Path(cfg.out), (json.dumps(results, indent=1) + "\n").encode())
        print(f"wrote {cfg.out}")
    return 0
