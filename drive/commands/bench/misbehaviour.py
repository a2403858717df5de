"""`drive bench misbehaviour`: misbehaviour prediction and prevention in closed loop on the field's protocol.

    drive monitor train --data runs/demos --out runs/selforacle.pt          # SelfOracle, on the demonstrations
    drive bench misbehaviour --ckpt checkpoints/carracing_nsac.pt --selforacle runs/selforacle.pt --out runs/mb

Per controller: nominal runs on --nominal-seeds (the false-positive windows and the thresholds) and one cell per
--shifts condition on --seeds, then, for each --fallback mode (slow, the headline; expert, an oracle bound), every
condition again with the fallback engaged at the threshold the protocol fits at --level. Monitors: the controller's
own uncertainty signals, SelfOracle (with --selforacle) and ThirdEye (Grad-CAM of the controller). Scored per
monitor x confidence level x TTM in {1, 2, 3} s
(precision, recall, FPR, F1, F3, AUROC, AUPRC, lead time, 95 % bootstrap intervals over episodes;
drive/studies/misbehaviour/protocol.py: by default windows scored alike on both sides, the first second of every run
unscored, thresholds fitted on one half of the nominal runs and counted on the other; `--protocol field` scores by the
field's own rules, and the default run shows their F3 and AUROC beside ours), held-out families apart from NSAC's
surrogate families. Writes DIR/cells/ (one file
per finished cell: a rerun resumes), DIR/results.json, DIR/results.md and DIR/seeds.png (checkpoints that differ only
in a seed<N> folder: one controller over training seeds, mean [interval]) or DIR/f3.png. `--ray` runs the episodes
on a Ray cluster; the run's CPU time is in results.json. `--report-only` rebuilds the report from the finished cells.
Every run writes DIR/records/<controller>.parquet (one row per step: labels and every monitor's score;
drive/studies/misbehaviour/records.py); `--from-records DIR` scores such records without driving (no prevention),
and `--monitor module:function` adds your per-step score of an episode's record as a monitor, live or from records.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from drive.errors import UserError
from drive.options import NonNegativeInt, OpenUnit, PositiveFloat, PositiveInt, Workers

if TYPE_CHECKING:
    from drive.studies.misbehaviour.grid import Plan

RESUMES = True  # rerunning the same command continues what an interrupted run left

# Severity escalation by default: each episode drives clean for 4 s (its own nominal stretch after the 1 s reset
# transient), then the family's level rises every 4 s and stays at the last: nearly every episode that misbehaves
# does so after a stretch from which windows can be scored. The levels span each family's range from mild to
# severe, fixed a priori (not tuned on any run); noise and brightness are NSAC's surrogate families, reported apart.
DEFAULT_SHIFTS = (
    "escalate:blur:1,2,4,8@4", "escalate:motion_blur:5,9,17,33@4", "escalate:fog:0.3,0.5,0.8,0.95@4",
    "escalate:darkness:0.3,0.5,0.8,0.95@4", "escalate:jpeg:80,90,97,99@4", "escalate:rain:20,40,80,200@4",
    "escalate:hue:30,60,90,180@4", "escalate:occlusion:0.1,0.25,0.4,0.6@4", "domain_randomize", "steer_delay:6",
    "action_noise:0.3", "escalate:noise:0.05,0.1,0.2,0.4@4", "escalate:brightness:0.8,0.6,0.4,0.2@4",
)  # fmt: skip


@dataclass(frozen=True)
class Config:
    out: Path
    """output directory (cells/, records/, results.json, results.md, seeds.png or f3.png); rerunning resumes"""
    ckpt: tuple[Path, ...] = (Path("checkpoints/carracing_nsac.pt"),)
    """controller checkpoints (CarRacing, frames), one column block each"""
    shifts: tuple[str, ...] = DEFAULT_SHIFTS
    """conditions: KIND:LEVEL, domain_randomize, module:function:LEVEL (yours), escalate:KIND:L1,L2,..@SECONDS"""
    nominal_seeds: str = "7000-7019"
    """track seeds of the nominal runs (false-positive windows, thresholds)"""
    seeds: str = "7100-7119"
    """track seeds of every shifted condition"""
    selforacle: Path | None = None
    """a SelfOracle checkpoint (drive monitor train); without it no SelfOracle column"""
    thirdeye: bool = True
    """ThirdEye scores (Grad-CAM of each controller's steering on its newest frame)"""
    fallback: tuple[Literal["off", "slow", "expert"], ...] = ("slow", "expert")
    """prevention: rerun every condition with each fallback at the --level threshold, the first the headline (off:
    prediction only); slow uses nothing privileged, expert hands over to the PPO expert (which drives from
    privileged state: an oracle bound)"""
    gate_signal: Literal["epistemic_sum", "epistemic_steer", "total_steer"] = "epistemic_sum"
    """the declared monitor, chosen before the run: the headline row and the signal the fallback gates on (its
    threshold fitted on every other nominal seed, its false alarms counted on the rest)"""
    gate_budget: PositiveFloat | None = None
    """the gate's false-alarm budget in hand-overs per km: its threshold the lowest at which the gate, replayed on
    the calibration seeds' nominal runs, engages at most this often (default: the threshold at --level)"""
    level: OpenUnit = 0.999
    """the confidence level (below 1) of the headline table and of the fallback's threshold"""
    ttm: PositiveInt = 2
    """the headline table's time to misbehaviour (s)"""
    protocol: Literal["alike", "field"] = "alike"
    """alike: windows scored alike, warm-up unscored, out-of-sample thresholds (field's rules beside); field: theirs"""
    bootstrap: PositiveInt = 1000
    """bootstrap replicates per interval"""
    samples: PositiveInt | None = None
    """stochastic samples per step (default: each controller's own)"""
    max_episode_steps: PositiveInt = 1000
    """step limit per episode"""
    workers: Workers = 1
    """parallel worker processes (with --ray: episodes in flight)"""
    envs: PositiveInt = 8
    """cars per worker process, one controller call per step for all (records do not depend on it)"""
    ray: str | None = None
    """run the episodes as Ray tasks: local, auto or HOST:PORT"""
    seed: NonNegativeInt = 0
    """the controllers' sampling seed and the bootstrap's"""
    progress: bool = True
    """progress bars"""
    report_only: bool = False
    """rebuild results from the finished cells, run nothing"""
    monitor: tuple[str, ...] = ()
    """your monitors, module:function each: a per-step score from an episode's recorded scores (docs/misbehaviour.md)"""
    from_records: Path | None = None
    """score a run's records (its DIR or DIR/records, Parquet) instead of driving: prediction only, no prevention"""


def run(cfg: Config) -> int:
    from drive.loop.pool import check_ray
    from drive.loop.seeds import parse_seeds
    from drive.perturb.registry import parse_shift  # the simulator, OpenCV and torch: not for `--help`
    from drive.studies.misbehaviour.cells import RunSettings
    from drive.studies.misbehaviour.figures import write_report
    from drive.studies.misbehaviour.grid import Plan, run_plan
    from drive.studies.misbehaviour.records import load_monitors
    from drive.studies.misbehaviour.text import headline

    if not cfg.ckpt:
        raise UserError("give at least one --ckpt")
    if cfg.level >= 1:
        raise UserError(f"--level {cfg.level}: a confidence level must be below 1 (at 1 the threshold is infinite)")
    for spec in cfg.shifts:
        try:
            parse_shift(spec)
        except ValueError as exc:
            raise UserError(f"--shifts {spec!r}: {exc}") from None
    load_monitors(cfg.monitor)  # a bad spec stops here, before any driving
    if cfg.selforacle is not None and not cfg.selforacle.is_file():
        raise UserError(f"--selforacle {cfg.selforacle}: no such file (train one: drive monitor train)")
    check_ray(cfg.ray)
    if "off" in cfg.fallback and len(cfg.fallback) > 1 or len(set(cfg.fallback)) != len(cfg.fallback):
        raise UserError(f"--fallback {' '.join(cfg.fallback)}: off alone, or slow and/or expert, each once")
    plan = Plan(
        controllers=tuple(str(p) for p in cfg.ckpt),
        shifts=cfg.shifts,
        nominal_seeds=tuple(parse_seeds(cfg.nominal_seeds)),
        seeds=tuple(parse_seeds(cfg.seeds)),
        fallback=cfg.fallback,
        level=cfg.level,
        ttm=cfg.ttm,
        n_boot=cfg.bootstrap,
        seed=cfg.seed,
        protocol=cfg.protocol,
        gate_signal=cfg.gate_signal,
        gate_budget=cfg.gate_budget,
        monitors=cfg.monitor,
    )
    if cfg.from_records is not None:
        return _from_records(cfg, cfg.from_records, plan)

    settings = RunSettings(
        max_episode_steps=cfg.max_episode_steps,
        samples=cfg.samples,
        seed=cfg.seed,
        workers=cfg.workers,
        envs=cfg.envs,
        ray=cfg.ray,
        progress=cfg.progress,
        selforacle=str(cfg.selforacle) if cfg.selforacle else None,
        thirdeye=cfg.thirdeye,
    )
    start, cpu0 = time.perf_counter(), _cpu_s()
    results = run_plan(cfg.out, plan, settings, run_missing=not cfg.report_only)
    results["this_run"] = {"wall_s": time.perf_counter() - start, "cpu_s": _cpu_s() - cpu0}
    paths = write_report(cfg.out, results)
    print(headline(results))
    print("wrote " + ", ".join(str(p) for p in [*paths, *(cfg.out / r for r in results["records"])]))
    return 0


def _from_records(cfg: Config, folder: Path, plan: Plan) -> int:
    from drive.studies.misbehaviour.figures import write_report
    from drive.studies.misbehaviour.grid import score_records
    from drive.studies.misbehaviour.text import headline

    start, cpu0 = time.perf_counter(), _cpu_s()
    results = score_records(folder, plan)
    results["this_run"] = {"wall_s": time.perf_counter() - start, "cpu_s": _cpu_s() - cpu0}
    paths = write_report(cfg.out, results)
    print(f"scored from records ({folder}): nothing driven; prevention skipped (it needs driving)")
    print(headline(results))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
