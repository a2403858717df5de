"""`drive bench misbehaviour`: misbehaviour prediction and prevention in closed loop, on the field's protocol with our
departures (drive/studies/misbehaviour/protocol.py; `Plan.protocol` "field" scores by their rules, and ours shows theirs
beside).

A grid of cells, one per (controller, condition[, fallback]): `nominal` (clean camera, the false-positive windows) and
each shift spec (drive/perturb/wrappers.py grammar: `KIND:LEVEL`, `domain_randomize`, a user's `module:function:LEVEL`,
`escalate:...`). A cell drives its track seeds through the same closed loop as `drive eval` (drive/loop/evaluate.py
`evaluate_episodes`: K cars per process, the process pool or Ray), with two observers per car: `FailureMonitor`
(the misbehaviours — off-track, spin, stall — from privileged state, their onsets and busy steps, and the
controller's own uncertainty signals per step) and `MonitorRecorder` (SelfOracle and ThirdEye scores per step,
drive/studies/misbehaviour/monitors.py). A finished cell is one file, `cells/<controller>/<condition>.npz` (per episode
its record and per-step arrays), written atomically: a killed benchmark rerun with the same arguments keeps every
finished cell and runs the rest (cells are the unit of resumption: a cell's episodes run together).

The prevention cells rerun each shifted condition (and nominal) with the uncertainty-gated fallback engaged on the
declared monitor (`Plan.gate_signal`, fixed before the run: the summed epistemic variance by default; the headline
row of the prediction table is the same monitor) at the threshold the protocol fits on it at `--level` over every
other nominal seed (1st, 3rd, ...); the gated nominal cell runs on the other nominal seeds, so its false alarms are
counted out of sample. "Prevented" and "false alarms" use the detector the prediction table scores.
drive/studies/misbehaviour/report.py turns the cells into results.json, results.md and plots; each controller's
ungated cells are also written as records, one Parquet row per step (drive/studies/misbehaviour/records.py), which
`score_records` scores again without driving.
"""

from __future__ import annotations

import io
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from datasets.files import atomic_write
from datasets.root import portable
from drive.errors import UserError
from drive.loop.evaluate import evaluate_episodes
from drive.loop.fallback import MODES
from drive.loop.lanes import episodes_in
from drive.loop.pool import run_tasks
from drive.loop.specs import PolicySpec
from drive.options import Workers
from drive.studies.misbehaviour import records as records
from drive.studies.misbehaviour import report as report
from drive.studies.misbehaviour.monitors import MonitorFactory
from drive.studies.misbehaviour.protocol import FIELD, LEVELS, SCORINGS, TTMS, ProtocolConfig
from drive.studies.misbehaviour.report import NOMINAL
from drive.studies.misbehaviour.rows import same_level
from drive.studies.misbehaviour.seeds import over_seeds


@dataclass(frozen=True)
class Cell:
    controller: str  # checkpoint path
    condition: str  # NOMINAL or a shift spec
    seeds: tuple[int, ...]
    fallback: str = "off"  # off | expert | slow
    threshold: float | None = None  # the fallback's threshold (prevention cells)

    @property
    def name(self) -> str:
        return self.condition + ("" if self.fallback == "off" else f"+fallback-{self.fallback}")


def slug(text: str) -> str:
    """A file-name-safe, readable, unique form of a checkpoint path or a condition spec."""
    return re.sub(r"[^A-Za-z0-9._,=+-]+", "_", text).strip("_") or "_"


def cell_path(out: Path, cell: Cell) -> Path:
    return out / "cells" / slug(cell.controller) / f"{slug(cell.name)}.npz"


@dataclass(frozen=True)
class RunSettings:
    """What every cell of a benchmark shares (primitives: it travels to pool and Ray workers)."""

    max_episode_steps: int = 1000
    samples: int | None = None
    shadow: str = "ppo"
    seed: int = 0
    workers: Workers = 1
    envs: int = 1
    ray: str | None = None
    progress: bool = True
    selforacle: str | None = None
    thirdeye: bool = True


def run_cell(cell: Cell, run: RunSettings) -> list[dict[str, Any]]:
    """The cell's episodes, one record per seed (seed order) with its per-step arrays."""
    policy = PolicySpec(
        "ckpt",
        cell.controller,
        env="carracing",
        samples=run.samples,
        seed=run.seed,
        shadow=run.shadow,
        fallback=cell.fallback,
        threshold=cell.threshold if cell.fallback != "off" else None,
    )
    settings = {
        "env": "carracing",
        "max_episode_steps": run.max_episode_steps,
        "failures": True,
        "perturb": "" if cell.condition == NOMINAL else cell.condition,
    }
    factory = MonitorFactory(cell.controller, run.selforacle, run.thirdeye)
    seeds = list(cell.seeds)
    tasks = [(policy, settings, tuple(seeds[i : i + run.envs])) for i in range(0, len(seeds), run.envs)]
    records: list[dict[str, Any]] = []
    run_tasks(
        timed_episodes,
        tasks,
        run.workers,
        records.extend,
        show=run.progress,
        label=cell.name[:40],
        extra=(factory,),
        ray=run.ray,
        size=episodes_in,
    )
    return sorted(records, key=lambda r: r["seed"])


def timed_episodes(
    spec: PolicySpec, settings: dict[str, Any], seeds: Sequence[int], tick: Any = None, observers: Any = None
) -> list[dict[str, Any]]:
    """`evaluate_episodes` (one worker's cars), each record with its car's share of the worker's CPU seconds
    ("cpu_s": simulator, rendering, controller and monitors; the cars share one controller call per step)."""
    cpu = time.process_time()
    records = evaluate_episodes(spec, settings, seeds, tick, observers)
    share = (time.process_time() - cpu) / max(len(records), 1)
    return [{**record, "cpu_s": share} for record in records]


ARRAYS = ("signals", "busy", "monitor_scores")


# what a cell's episodes depend on besides the cell itself; a cell driven with other values is refused
DRIVEN_WITH = ("max_episode_steps", "samples", "shadow", "seed", "selforacle", "thirdeye")


def save_cell(
    path: Path, cell: Cell, records: Sequence[dict[str, Any]], seconds: float, run: RunSettings | None = None
) -> None:
    """One .npz: `meta` (JSON: the cell, the settings it was driven with and each episode's record without arrays)
    and the arrays per episode."""
    arrays: dict[str, np.ndarray] = {}
    episodes = []
    for i, record in enumerate(records):
        for key in ARRAYS:
            arrays[f"{key}_{i}"] = np.asarray(record.get(key, np.zeros(0)))
        episodes.append({k: v for k, v in record.items() if k not in ARRAYS})
    meta = {
        "cell": {
            "controller": portable(cell.controller),
            "condition": cell.condition,
            "seeds": list(cell.seeds),
            "fallback": cell.fallback,
            "threshold": cell.threshold,
        },
        "episodes": episodes,
        "seconds": seconds,
    }
    if run is not None:
        meta["settings"] = {k: portable(getattr(run, k)) for k in DRIVEN_WITH}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub takes **kwds for allow_pickle
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buf.getvalue())


def load_cell(path: Path) -> dict[str, Any]:
    """{"cell", "episodes" (each with its arrays back), "seconds"} of a saved cell."""
    with np.load(path) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        for i, ep in enumerate(meta["episodes"]):
            for key in ARRAYS:
                ep[key] = z[f"{key}_{i}"]
    return meta


def _same(a: float | None, b: float | None) -> bool:
    return a is None and b is None or a is not None and b is not None and abs(a - b) <= 1e-12 * max(abs(a), abs(b))


def ensure_cell(out: Path, cell: Cell, run: RunSettings) -> dict[str, Any]:
    """The cell from its file, or run and saved first (the benchmark's unit of resumption)."""
    path = cell_path(out, cell)
    if path.is_file():
        saved = load_cell(path)
        if saved["cell"]["seeds"] != list(cell.seeds) or not _same(saved["cell"]["threshold"], cell.threshold):
            raise UserError(
                f"{path} holds other seeds or another threshold than this run asks for; use another "
                "--out or delete the cell"
            )
        asked = {k: portable(getattr(run, k)) for k in DRIVEN_WITH}
        other = {k: v for k, v in saved.get("settings", {}).items() if asked.get(k) != v}
        if other:  # cells written before the settings were stored carry none: nothing to compare
            raise UserError(
                f"{path} was driven with other settings ({', '.join(f'{k}={v}' for k, v in other.items())}) "
                "than this run asks for; use another --out or delete the cell"
            )
        return saved
    start = time.perf_counter()
    records = run_cell(cell, run)
    save_cell(path, cell, records, time.perf_counter() - start, run)
    return load_cell(path)


# the monitors a gate can read every step (drive/loop/fallback.py): monitor -> (its signal, its variance)
GATES = {"epistemic_sum": ("sum", "epistemic"), "epistemic_steer": ("steer", "epistemic"),
         "total_steer": ("steer", "total")}  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """What a benchmark runs and how it is scored. The headline's level and TTM are scored too, whichever levels and
    TTMs the tables list (any level in (0, 1), any whole TTM >= 1: drive/studies/misbehaviour/protocol.py)."""

    controllers: tuple[str, ...]
    shifts: tuple[str, ...]
    nominal_seeds: tuple[int, ...]
    seeds: tuple[int, ...]
    fallback: tuple[str, ...] = ("slow", "expert")
    """the prevention modes, each its own gated cells; the first is the headline (slow: nothing privileged), the
    others bounds (expert: the PPO expert drives from privileged state); () or "off": prediction only"""
    level: float = 0.999
    ttm: int = 2
    n_boot: int = 1000
    seed: int = 0
    levels: tuple[float, ...] = LEVELS
    ttms: tuple[int, ...] = TTMS
    protocol: str = "alike"
    """alike (ours: protocol.ProtocolConfig()) or field (protocol.FIELD, the field's rules)"""
    monitors: tuple[str, ...] = ()
    """your monitors, module:function each (drive/studies/misbehaviour/records.py)"""
    gate_signal: str = "epistemic_sum"
    """the declared monitor, fixed before the run: the headline's row and the signal the fallback gates on"""
    gate_budget: float | None = None
    """the gate's false-alarm budget, hand-overs per km on the calibration seeds (report.budget_threshold); None:
    the threshold at `level` (report.nominal_threshold)"""

    def __post_init__(self) -> None:
        if not 0 < self.level < 1 or int(self.ttm) != self.ttm or self.ttm < 1 or self.protocol not in SCORINGS:
            raise ValueError(
                f"Plan: level in (0, 1), a whole ttm >= 1, protocol in {SCORINGS}; got {self.level}, "
                f"{self.ttm}, {self.protocol!r}"
            )
        modes = (self.fallback,) if isinstance(self.fallback, str) else tuple(self.fallback)
        modes = tuple(m for m in modes if m != "off")
        if len(set(modes)) != len(modes) or not set(modes) <= set(MODES):
            raise ValueError(f"Plan: fallback modes from {MODES}, each once; got {self.fallback!r}")
        object.__setattr__(self, "fallback", modes)
        if self.gate_budget is not None and not self.gate_budget > 0:
            raise ValueError(f"Plan: gate_budget {self.gate_budget} hand-overs per km must be above 0")
        if self.gate_signal not in GATES:
            raise ValueError(f"Plan: gate_signal {self.gate_signal!r}, choose one of {sorted(GATES)}")
        levels = {v for v in self.levels if not same_level(v, self.level)}  # the asked level stands for its equal
        object.__setattr__(self, "levels", tuple(sorted({*levels, self.level})))
        object.__setattr__(self, "ttms", tuple(sorted({*self.ttms, self.ttm})))

    @property
    def protocol_config(self) -> ProtocolConfig:
        return FIELD if self.protocol == "field" else ProtocolConfig()

    def gate(self, mode: str) -> str:
        """The fallback spec of a mode's prevention cells: the mode, gating on the declared monitor."""
        signal, variance = GATES[self.gate_signal]
        return f"{mode}:signal={signal},variance={variance}"

    @property
    def calibration_seeds(self) -> tuple[int, ...]:
        """The nominal seeds the gate's threshold is fitted on (1st, 3rd, ...); the others measure its false alarms."""
        return self.nominal_seeds[0::2] if len(self.nominal_seeds) > 1 else self.nominal_seeds

    @property
    def false_alarm_seeds(self) -> tuple[int, ...]:
        return self.nominal_seeds[1::2] if len(self.nominal_seeds) > 1 else self.nominal_seeds


def _results(plan: Plan, settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "plan": {**plan.__dict__},
        "protocol": report.protocol_settings(plan.protocol_config),
        "settings": settings,
        "controllers": {},
        "published": report.PUBLISHED,
    }


def _predicted(plan: Plan, cells: dict[str, Any], families: dict[str, tuple[str, bool]] | None = None) -> dict:
    """A controller's prediction tables and episode counts from its ungated cells ({condition: cell})."""
    return {
        "prediction": report.prediction(
            cells,
            plan.protocol_config,
            plan.levels,
            plan.ttms,
            plan.n_boot,
            plan.seed,
            level=plan.level,
            ttm=plan.ttm,
            families=families,
        ),
        "episodes": {c: _summary(v) for c, v in cells.items()},
    }


def run_plan(out: Path, plan: Plan, run: RunSettings, run_missing: bool = True) -> dict[str, Any]:
    """Every cell (run if missing, unless `run_missing` is False: then only the finished ones count), each
    controller's records (DIR/records/, records.py), then the tables of
    drive/studies/misbehaviour/report.py; returns results.json's dict."""
    cfg = plan.protocol_config
    monitors = records.load_monitors(plan.monitors)
    results = _results(plan, run.__dict__)
    results["records"] = []
    seconds = 0.0

    def cell(c: Cell) -> dict[str, Any] | None:
        nonlocal seconds
        if not run_missing and not cell_path(out, c).is_file():
            return None
        got = ensure_cell(out, c, run)
        seconds += float(got.get("seconds", 0.0))
        return got

    for position, controller in enumerate(plan.controllers):
        entry: dict[str, Any] = {}
        cells: dict[str, Any] = {}
        for condition in (NOMINAL, *plan.shifts):
            seeds = plan.nominal_seeds if condition == NOMINAL else plan.seeds
            got = cell(Cell(controller, condition, seeds))
            if got is not None:
                cells[condition] = got
        records.with_monitors(cells, monitors)
        if any(c["episodes"] for c in cells.values()):
            path = Path("records") / f"{slug(controller)}.parquet"  # results.json names it relative to `out`
            records.write_records(out / path, controller, cells, position)
            results["records"].append(str(path))
        if NOMINAL in cells:
            entry |= _predicted(plan, cells)
            try:
                threshold = (
                    None
                    if not plan.fallback
                    else report.nominal_threshold(
                        cells[NOMINAL], plan.level, cfg, plan.gate_signal, plan.calibration_seeds
                    )
                    if plan.gate_budget is None
                    else report.budget_threshold(
                        cells[NOMINAL], plan.gate_budget, plan.gate_signal, plan.calibration_seeds
                    )
                )
            except ValueError as exc:  # a controller that misbehaves on every nominal run: nothing to gate on
                entry["fallback_skipped"] = f"no prevention cells: {exc}"
                threshold = None
            # an episode whose first misbehaviour comes before its first scorable window at the headline TTM
            # (warm-up + TTM) failed too early to predict: counted apart, not in the per-episode share prevented
            early = round(cfg.fps * (cfg.warmup_s + plan.ttm))
            for mode in plan.fallback if threshold is not None else ():
                block: dict[str, Any] = {
                    "mode": mode,
                    "threshold": threshold,
                    "level": plan.level,
                    "budget_per_km": plan.gate_budget,
                    "signal": plan.gate_signal,
                    "calibrated_on": list(plan.calibration_seeds),
                    "conditions": {},
                }
                for condition, ungated in cells.items():
                    seeds = plan.false_alarm_seeds if condition == NOMINAL else plan.seeds
                    gated = cell(Cell(controller, condition, seeds, plan.gate(mode), threshold))
                    if gated is not None:
                        block["conditions"][condition] = report.prevention(
                            ungated, gated, plan.n_boot, plan.seed, early_steps=early
                        )
                entry.setdefault("fallbacks", {})[mode] = block
        results["controllers"][controller] = entry
    results["cells_wall_s"] = seconds
    results["over_seeds"] = over_seeds(results)
    return results


def score_records(folder: Path, plan: Plan) -> dict[str, Any]:
    """results.json's dict from a run's records (records.py) instead of its cells: the prediction tables
    of every controller there, scored by `plan`'s protocol, levels, TTMs and monitors; no prevention (it needs
    driving). The controllers, conditions and seeds are the records'."""
    monitors = records.load_monitors(plan.monitors)
    controllers, families = records.read_records(folder)
    conditions = dict.fromkeys(c for cells in controllers.values() for c in cells if c != NOMINAL)
    seeds = {
        c: sorted({ep["seed"] for cells in controllers.values() for ep in cells.get(c, {}).get("episodes", [])})
        for c in (NOMINAL, *conditions)
    }
    plan = replace(
        plan,
        controllers=tuple(controllers),
        shifts=tuple(conditions),
        fallback=(),
        nominal_seeds=tuple(seeds[NOMINAL]),
        seeds=tuple(sorted({s for c in conditions for s in seeds[c]})),
    )
    results = _results(plan, {"from_records": str(folder)})
    for controller, cells in controllers.items():
        records.with_monitors(cells, monitors)
        entry = _predicted(plan, cells, families)
        entry["fallback_skipped"] = "scored from records: prevention needs driving"
        results["controllers"][controller] = entry
    results["cells_wall_s"] = 0.0
    results["over_seeds"] = over_seeds(results)
    return results


def _summary(cell: dict[str, Any]) -> dict[str, Any]:
    eps = cell["episodes"]
    returns = [e["return"] for e in eps if "return" in e]  # records keep no returns
    return {
        "episodes": len(eps),
        "misbehaving": sum(1 for e in eps if e.get("events")),
        "misbehaviours": sum(len(e.get("events", [])) for e in eps),
        "mean_return": float(np.mean(returns)) if returns else float("nan"),
        "seconds": cell.get("seconds"),
        "steps": int(sum(len(e.get("busy", ())) for e in eps)),
        "cpu_s": float(sum(e.get("cpu_s", math.nan) for e in eps)),
    }
