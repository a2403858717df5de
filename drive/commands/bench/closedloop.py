"""`drive bench closedloop`: steps per CPU-second (frames/s per core) of the closed loop, from the bare env to
`drive collect` and `drive eval`, measured in one run and printed side by side with the ratios the issue targets:

    our renderer >= 1.0x EnvPool's C++ CarRacing          collect (1 worker) >= 0.9x our renderer
    eval, best K cars per process >= 0.8x our renderer    collect (2 workers) >= 1.7x collect (1 worker), wall

Rows: gymnasium's stock CarRacing-v3 (pygame renderer), our pixel env (`make_carracing`, fast renderer) and EnvPool's
CarRacing-v2 (one env, one thread; run in a subprocess of `--envpool-python`, so it may live in another venv, and
skipped with a note where it does not import), all three on the same pre-drawn random actions and again on the
expert's laps replayed open loop (drive/studies/closedloop/envs.py says why both), in `--rounds` rounds that
alternate their order; then `drive collect --envs 0` (one car per process) on 1 worker, in `--rounds` rounds
alternating with `--envs 4` (`--collect-envs`), and on 2 workers; `drive eval` of a trained controller with K = 1, 4,
16, 32, 64 cars per process (`--envs K`), and the best K again on 2 workers. First, untimed and printed as
start-up, one step of each env and a 3-step collect and eval: what a process pays once (imports, numba's kernels,
pygame's font, checkpoints), which short timed rows would otherwise charge to their steps (EnvPool's subprocess likewise
times its step loop only). Collect and eval rates then count the whole run (pool workers' start-up, policy
building, shards written) over all its steps; eval without failure prediction, whose nominal calibration laps would
cost CPU the rate does not count (`failure_horizon=0`). Last, one controller call of the best K is timed back to back
and between env steps (drive/studies/closedloop/controller_calls.py): what the eval rows pay per call beyond the
network's own cost; then collect and eval run once more with timers around their stages
(drive/studies/closedloop/stages.py): where a step goes, and what the 0.9x and 0.8x targets leave a step beside the
env's own time. `--stages-only` runs that last part alone (eval at the largest `--envs`), about a minute.

Per-core rates are steps over the CPU time of this process and its workers (the EnvPool subprocess measures its own,
threads included): what a step costs, whatever else runs. Wall-clock rates are printed beside them and the 2-worker
ratio is a wall one (on a shared machine they measure the neighbours: the load average is recorded). The collect
and eval ratios are given against both streams of our env: random actions (the issue's figure) and the expert's laps
(like for like: collect drives exactly the replayed laps, eval the same tracks), each measured again beside the loop
row it divides (in each collect round, just before and after each 1-worker eval run: `bare_env`), since CPU time per
step drifts on a shared machine between rows minutes apart; the table prints those rates beside each row. Two
ceilings follow the ratios: the laps' rate over random actions' in our env (no loop that drives the laps can exceed
it against random actions) and eval's rate were only the env step and the controller call's back-to-back share
spent. Beside each per-core ratio the range it spans round by round (`round_ranges`): where that range straddles a
target, the machine's drift decided the verdict, which then reads "met, within noise" or "MISSED, within noise"
(`verdict`; also in the JSON); both, with the ratios, ceilings and targets, in drive/studies/closedloop/ratios.py.
A benchmark.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from datasets.files import atomic_write
from datasets.root import portable
from drive.errors import UserError
from drive.loop.options import SHIPPED_CONTROLLER, SHIPPED_HINT
from drive.options import NonNegativeInt, PositiveInt
from drive.studies.closedloop.envs import Row, measure_envs, warm_up
from drive.studies.closedloop.loops import best_eval, measure_loops, warm_up_loops
from drive.studies.closedloop.ratios import (
    TARGETS,
    network_ceiling,
    ratios_of,
    round_ranges,
    verdict,
)
from drive.studies.closedloop.report import controller_calls, print_ceilings, print_tables
from drive.studies.closedloop.stages import timed_stages


@dataclass(frozen=True)
class Config:
    out: Path | None = None
    """results JSON file; default: print only"""
    steps: PositiveInt = 1000
    """env steps per round of each env loop (stock, our renderer, EnvPool)"""
    rounds: PositiveInt = 3
    """rounds of the env loops, their order alternating, summed per loop"""
    episodes: PositiveInt = 4
    """episodes per collect run (1 worker, then 2 workers); even, so two workers share them equally"""
    max_episode_steps: PositiveInt = 1000
    """step limit per collect episode"""
    expert: str = "ppo"
    """expert that drives the collect runs (ppo, pursuit)"""
    ckpt: Annotated[Path, SHIPPED_HINT] = SHIPPED_CONTROLLER
    """the trained controller the eval runs drive"""
    samples: PositiveInt = 32
    """eval: stochastic samples per step"""
    collect_envs: tuple[int, ...] = (4,)
    """other cars per process (K) of the 1-worker collect runs, in the same rounds as `--envs 0`'s (one car): what
    stepping K envs in turn costs against batching their expert calls (what `drive collect --envs 0` is set by)"""
    envs: tuple[int, ...] = (1, 4, 16, 32, 64)
    """eval: cars per process (K) of the 1-worker runs; the best per core runs again on 2 workers"""
    eval_episodes: PositiveInt = 64
    """episodes per 1-worker eval run, at least the largest K (the 2-worker run drives twice as many)"""
    eval_max_episode_steps: PositiveInt = 1000
    """step limit per eval episode: full episodes, like the env loops (a reset builds a track: in short episodes its
    cost would be charged to the eval rows)"""
    first_seed: NonNegativeInt = 5000
    """track seeds of every run: first_seed, first_seed + 1, ..."""
    controller_calls: NonNegativeInt = 30
    """controller calls of the best K timed each way: back to back, after frame-less and after pixel env steps
    (0: not measured)"""
    stages: bool = True
    """then run collect and eval (best K) once more with timers around their stages: where a step goes"""
    stages_only: bool = False
    """only those stage timings (eval at the largest --envs), no rows or ratios: about a minute"""
    envpool_python: str | None = None
    """python that runs the EnvPool row (default: this one); its row is skipped with a note where envpool does not
    import there"""

    @property
    def policy(self) -> str:
        """the loop's policy spec of --ckpt"""
        return f"ckpt:{self.ckpt}"


def run(cfg: Config) -> int:
    import cv2
    import torch
    from rich.console import Console

    if cfg.episodes % 2:
        raise UserError(f"--episodes must be even (two workers share them equally), got {cfg.episodes}")
    if not cfg.envs or min(cfg.envs) < 1:
        raise UserError(f"--envs: cars per process, each >= 1, got {cfg.envs}")
    if cfg.collect_envs and min(cfg.collect_envs) < 1:
        raise UserError(f"--collect-envs: cars per process, each >= 1, got {cfg.collect_envs}")
    if cfg.eval_episodes < max(cfg.envs):
        raise UserError(
            f"--eval-episodes {cfg.eval_episodes} is below --envs {max(cfg.envs)}: a row of K cars "
            f"would drive only as many cars as it has episodes"
        )
    torch.set_num_threads(1)  # the 1-worker runs are in this process: one thread each, as the pool's workers have
    cv2.setNumThreads(1)
    console = Console()
    load_before = os.getloadavg()[0]
    with console.status("warming up (first-call costs, not timed) ..."):
        start_up = {"envs_cpu_s": warm_up(cfg.max_episode_steps), "loops_cpu_s": warm_up_loops(cfg)}
    console.print(
        f"start-up before the timed rows: {start_up['envs_cpu_s']:.1f} CPU-s (envs), "
        f"{start_up['loops_cpu_s']:.1f} CPU-s (collect and eval: imports, checkpoints)"
    )
    if cfg.stages_only:
        return _stages_only(cfg, console, start_up, load_before)
    rows: dict[str, Row] = {**measure_envs(cfg, console), **measure_loops(cfg, console)}
    best = best_eval(rows, cfg.envs)
    ratios, ranges = ratios_of(rows, cfg.envs), round_ranges(rows, cfg.envs)
    print_tables(console, rows, ratios, ranges)
    calls = controller_calls(cfg, best, console)
    ceiling = network_ceiling(rows, cfg.envs, calls)
    print_ceilings(console, ratios, ceiling, best)
    stages = timed_stages(cfg, best, console) if cfg.stages and best is not None else None
    machine = _machine(load_before)
    met = {key: None if (ratio := ratios[key]) is None else ratio >= target for key, target in TARGETS.items()}
    results = {
        "rows": {key: row.to_dict() for key, row in rows.items()},
        "ratios": ratios,
        "ratio_round_ranges": ranges,
        "targets": TARGETS,
        "verdicts": {key: verdict(ratios[key], target, ranges.get(key)) for key, target in TARGETS.items()},
        "best_envs": best,
        "met": met,
        "eval_network_ceiling": ceiling,
        "start_up": start_up,
        "controller_call_cpu_ms": calls,
        "loop_stages": stages,
        "config": _config(cfg),
        "machine": machine,
    }
    _write(cfg, results, console)
    return 0


def _stages_only(cfg: Config, console: Any, start_up: dict[str, float], load_before: float) -> int:
    k = max(cfg.envs)
    results = {
        "loop_stages": timed_stages(cfg, k, console),
        "envs": k,
        "start_up": start_up,
        "config": _config(cfg),
        "machine": _machine(load_before),
    }
    _write(cfg, results, console)
    return 0


def _machine(load_before: float) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg_1m_before": load_before,
        "load_avg_1m_after": os.getloadavg()[0],
    }


def _config(cfg: Config) -> dict[str, Any]:
    return portable({k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()})


def _write(cfg: Config, results: dict[str, Any], console: Any) -> None:
    if cfg.out is not None:
        atomic_write(Path(cfg.out), (json.dumps(results, indent=1) + "\n").encode())
        console.print(f"wrote {cfg.out}")
