"""`drive bench misbehaviour`: misbehaviour prediction and prevention in closed loop, scored as the field scores it.

A grid of cells, one per (controller, condition[, fallback]): `nominal` (clean camera, the false-positive windows) and
each shift spec (drive/loop/perturb.py grammar: `KIND:LEVEL`, `domain_randomize`, a user's `module:function:LEVEL`,
`escalate:...`). A cell drives its track seeds through the same closed loop as `drive eval` (drive/loop/evaluate.py
`evaluate_episodes`: K cars per process, the process pool or Ray), with two observers per car: `FailureMonitor`
(the misbehaviours — off-track, spin, stall — from privileged state, their onsets and busy steps, and the
controller's own uncertainty signals per step) and `MonitorRecorder` (SelfOracle and ThirdEye scores per step,
drive/studies/monitoring.py). A finished cell is one file, `cells/<controller>/<condition>.npz` (per episode its
record and per-step arrays), written atomically: a killed benchmark rerun with the same arguments keeps every
finished cell and runs the rest (cells are the unit of resumption: a cell's episodes run together).

The prevention cells rerun each shifted condition (and nominal) with the uncertainty-gated fallback engaged at the
threshold the protocol fits on the nominal cell's epistemic steering variance at `--level` (the Gamma fit of the
field, drive/studies/protocol.py), so "prevented" and "false alarms" use the detector the prediction table scores.
drive/studies/misbehaviour_report.py turns the cells into results.json, results.md and plots.
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datasets.files import atomic_write
from datasets.root import portable
from drive.loop.evaluate import evaluate_episodes
from drive.loop.lanes import episodes_in
from drive.loop.pool import run_tasks
from drive.options import Workers
from drive.studies import misbehaviour_report as report
from drive.studies.misbehaviour_report import NOMINAL
from drive.studies.monitoring import MonitorFactory


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
    options: dict[str, Any] = {"samples": run.samples, "shadow": run.shadow, "seed": run.seed, "device": "cpu",
                               "fallback": cell.fallback}  # fmt: skip
    if cell.fallback != "off":
        options["fallback_threshold"] = cell.threshold
    settings = {"env": "carracing", "max_episode_steps": run.max_episode_steps, "failures": True,
                "policy_options": tuple(sorted(options.items())),
                "perturb": "" if cell.condition == NOMINAL else cell.condition}  # fmt: skip
    factory = MonitorFactory(cell.controller, run.selforacle, run.thirdeye)
    seeds = list(cell.seeds)
    tasks = [(f"ckpt:{cell.controller}", settings, tuple(seeds[i : i + run.envs]))
             for i in range(0, len(seeds), run.envs)]  # fmt: skip
    records: list[dict[str, Any]] = []
    run_tasks(evaluate_episodes, tasks, run.workers, records.extend, show=run.progress, label=cell.name[:40],
              extra=(factory,), ray=run.ray, size=episodes_in)  # fmt: skip
    return sorted(records, key=lambda r: r["seed"])


ARRAYS = ("signals", "busy", "monitor_scores")


def save_cell(path: Path, cell: Cell, records: Sequence[dict[str, Any]], seconds: float) -> None:
    """One .npz: `meta` (JSON: the cell and each episode's record without arrays) and the arrays per episode."""
    arrays: dict[str, np.ndarray] = {}
    episodes = []
    for i, record in enumerate(records):
        for key in ARRAYS:
            arrays[f"{key}_{i}"] = np.asarray(record.get(key, np.zeros(0)))
        episodes.append({k: v for k, v in record.items() if k not in ARRAYS})
    meta = {"cell": {"controller": portable(cell.controller), "condition": cell.condition, "seeds": list(cell.seeds),
                     "fallback": cell.fallback, "threshold": cell.threshold},
            "episodes": episodes, "seconds": seconds}  # fmt: skip
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
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
            raise ValueError(f"{path} holds other seeds or another threshold than this run asks for; use another "
                             "--out or delete the cell")  # fmt: skip
        return saved
    start = time.perf_counter()
    records = run_cell(cell, run)
    save_cell(path, cell, records, time.perf_counter() - start)
    return load_cell(path)


@dataclass(frozen=True)
class Plan:
    """What a benchmark runs and how it is scored."""

    controllers: tuple[str, ...]
    shifts: tuple[str, ...]
    nominal_seeds: tuple[int, ...]
    seeds: tuple[int, ...]
    fallback: str = "expert"
    level: float = 0.999
    ttm: int = 2
    n_boot: int = 1000
    seed: int = 0
    levels: tuple[float, ...] = (0.95, 0.99, 0.999, 0.9999, 0.99999)
    ttms: tuple[int, ...] = (1, 2, 3)


def run_plan(out: Path, plan: Plan, run: RunSettings, run_missing: bool = True) -> dict[str, Any]:
    """Every cell (run if missing, unless `run_missing` is False: then only the finished ones count), then the
    tables of drive/studies/misbehaviour_report.py; returns results.json's dict."""
    from drive.studies.protocol import ProtocolConfig

    cfg = ProtocolConfig()
    results: dict[str, Any] = {"plan": {**plan.__dict__}, "protocol": report.protocol_settings(cfg),
                               "settings": run.__dict__, "controllers": {}, "published": report.PUBLISHED}  # fmt: skip
    seconds = 0.0

    def cell(c: Cell) -> dict[str, Any] | None:
        nonlocal seconds
        if not run_missing and not cell_path(out, c).is_file():
            return None
        got = ensure_cell(out, c, run)
        seconds += float(got.get("seconds", 0.0))
        return got

    for controller in plan.controllers:
        entry: dict[str, Any] = {}
        cells: dict[str, Any] = {}
        for condition in (NOMINAL, *plan.shifts):
            seeds = plan.nominal_seeds if condition == NOMINAL else plan.seeds
            got = cell(Cell(controller, condition, seeds))
            if got is not None:
                cells[condition] = got
        if NOMINAL in cells:
            entry["prediction"] = report.prediction(cells, cfg, plan.levels, plan.ttms, plan.n_boot, plan.seed)
            entry["episodes"] = {c: _summary(v) for c, v in cells.items()}
            try:
                threshold = (
                    report.nominal_threshold(cells[NOMINAL], plan.level, cfg) if plan.fallback != "off" else None
                )
            except ValueError as exc:  # a controller that misbehaves on every nominal run: nothing to gate on
                entry["fallback_skipped"] = f"no prevention cells: {exc}"
                threshold = None
            if threshold is not None:
                entry["fallback"] = {"mode": plan.fallback, "threshold": threshold, "level": plan.level,
                                     "signal": "epistemic_steer", "conditions": {}}  # fmt: skip
                for condition, ungated in cells.items():
                    seeds = plan.nominal_seeds if condition == NOMINAL else plan.seeds
                    gated = cell(Cell(controller, condition, seeds, plan.fallback, threshold))
                    if gated is not None:
                        entry["fallback"]["conditions"][condition] = report.prevention(ungated, gated, plan.n_boot,
                                                                                       plan.seed)  # fmt: skip
        results["controllers"][controller] = entry
    results["cells_wall_s"] = seconds
    results["over_seeds"] = report.over_seeds(results)
    return results


def _summary(cell: dict[str, Any]) -> dict[str, Any]:
    eps = cell["episodes"]
    return {"episodes": len(eps), "misbehaving": sum(1 for e in eps if e.get("events")),
            "misbehaviours": sum(len(e.get("events", [])) for e in eps),
            "mean_return": float(np.mean([e["return"] for e in eps])) if eps else float("nan"),
            "seconds": cell.get("seconds")}  # fmt: skip
