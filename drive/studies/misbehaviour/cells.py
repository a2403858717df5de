"""The closed-loop grid's cells: one per (controller, condition[, fallback]), driven through the same closed loop as
`drive eval` (drive/loop/evaluate.py `evaluate_episodes`: K cars per process, the process pool or Ray) with two
observers per car: `FailureMonitor` (the misbehaviours — off-track, spin, stall — from privileged state, their onsets
and busy steps, and the controller's own uncertainty signals per step) and `MonitorRecorder` (SelfOracle and ThirdEye
scores per step, drive/studies/misbehaviour/monitors.py).

A finished cell is one file, `cells/<controller>/<condition>.npz` (per episode its record and per-step arrays, and the
settings it was driven with), written atomically: the benchmark's unit of resumption. A cell on disk driven with other
seeds, another threshold or other settings is refused in one line rather than mixed into a table.
"""

from __future__ import annotations

import io
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datasets.files import atomic_write
from datasets.root import portable
from drive.errors import UserError
from drive.loop.evaluate import evaluate_episodes
from drive.loop.lanes import episodes_in
from drive.loop.pool import run_tasks
from drive.loop.specs import PolicySpec
from drive.options import Workers
from drive.studies.misbehaviour.monitors import MonitorFactory
from drive.studies.misbehaviour.report import NOMINAL


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


def summary(cell: dict[str, Any]) -> dict[str, Any]:
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
