"""Offline benchmark grids: every (dataset, controller, seed) cell of a task trained and evaluated, then aggregated.

    grid = make_grid("uci", protocol="gal", datasets=("boston",), controllers=("all",), seeds=3, out=Path(DIR))
    run_grid(grid)                    # trains the cells that have no metrics.json yet (progress bar with ETA)
    results = aggregate(grid)         # the tables: mean / std over runs, the paper's numbers, the references

Each cell is one `drive.learn.experiment.train_and_evaluate` run in DIR/runs/<dataset>/<row>/seed<s>, identical to
the `drive train` command recorded with it (`Cell.command`). The run directory with its metrics.json is the record:
a killed grid rerun with the same arguments keeps every finished cell, resumes an interrupted one from its
resume.pt, and trains the rest; a run directory written by another command (other overrides or epochs) is an error
rather than a silent mix. A cell that fails (a diverged run) is recorded with its error and retried on the next run.

What a task module contributes (drive/learn/tasks/__init__.py documents the contract; all optional but Options):
DATASETS / PROTOCOLS (the Options fields `dataset` / `protocol` select one; a task without them is one table),
CONTROLLERS (registry names: the rows `--controllers all` runs, then every VARIANT), VARIANTS ({row:
(controller, overrides)}: a row that is a controller with fixed `--set` overrides, e.g. spiral's NSAC without its
regulariser), DEFAULT_SEEDS ({protocol: n}),
n_runs(dataset, protocol, root) (the most runs a protocol has), PAPER ({protocol: {table key: {row: {metric:
value}}}}, the table key being the dataset for its headline test set and "dataset/name" for metrics.json
"tests"[name]; "default" stands for the protocol of a task without one), PAPER_SOURCES ({protocol: citation}),
REPORT_PLOTS (which pooled plots drive/observe/report.py draws), summary(runs) (a task's own tables and claims over
the finished runs, [{"dataset", "row", "seed", "metrics"}] -> {"tables": [{"title", "note", "columns", "rows"}],
"claims": [{"id", "claim", "paper", "ours", "reproduced"}]}, results.json "summary", rendered by the report).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shlex
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from tqdm.auto import tqdm

from agents.registry import CONTROLLERS as REGISTRY
from drive.errors import UserError
from drive.learn import tasks
from drive.learn.experiment import TrainRequest, train_and_evaluate

log = logging.getLogger(__name__)

METRICS = ("mse", "rmse", "mae", "nll", "crps", "ece", "pit_w1", "coverage_90", "width_90")
TIMES = {"train_s": "train_seconds", "infer_s": "eval_seconds"}
NO_PROTOCOL = "default"
# the controller code a cell ran (sha256 of agents/**/*.py), recorded in RUN/config.json: rows mixing versions say so
AGENTS_SHA = hashlib.sha256(b"".join(p.read_bytes() for p in sorted((Path(__file__).resolve().parents[2] / "agents")
                                                                       .rglob("*.py")))).hexdigest()[:12]  # fmt: skip


class Cell(NamedTuple):
    dataset: str | None
    row: str  # the table row: a controller name or a task VARIANT
    controller: str
    seed: int
    run_dir: Path
    overrides: tuple[str, ...]
    command: str  # the `drive train` command line of this cell


@dataclass(frozen=True)
class Grid:
    task: str
    protocol: str | None
    datasets: tuple[str | None, ...]
    rows: tuple[str, ...]
    seeds: tuple[int, ...]
    out: Path
    data: str | None = None
    epochs: int | None = None
    overrides: tuple[str, ...] = ()
    threads: int = 1
    device: str = "cpu"


def task_attr(task: str, name: str, default: Any = None) -> Any:
    return getattr(tasks.module(task), name, default)


def make_grid(task: str, *, protocol: str | None = None, datasets: tuple[str, ...] = (),
              controllers: tuple[str, ...] = ("all",), seeds: int | None = None, out: Path,
              data: str | None = None, epochs: int | None = None, overrides: tuple[str, ...] = (),
              threads: int = 1, device: str = "cpu") -> Grid:  # fmt: skip
    """Check the options against the task's DATASETS / PROTOCOLS / CONTROLLERS and build the grid."""
    mod = tasks.module(task)
    protocols = getattr(mod, "PROTOCOLS", ())
    if protocols:
        protocol = protocol or tasks.options(task, {}).protocol
        if protocol not in protocols:
            raise UserError(f"--protocol {protocol!r}: task {task!r} has protocols {', '.join(protocols)}")
    elif protocol:
        raise UserError(f"--protocol: task {task!r} has no protocols")
    known = getattr(mod, "DATASETS", ())
    if known:
        names: tuple[str | None, ...] = tuple(datasets) or (tasks.options(task, {}).dataset,)
        bad = [d for d in names if d not in known]
        if bad:
            raise UserError(f"--datasets {', '.join(map(str, bad))}: task {task!r} has {', '.join(known)}")
    elif datasets:
        raise UserError(f"--datasets: task {task!r} has no datasets")
    else:
        names = (None,)
    rows = _rows(mod, task, controllers)
    n = seeds if seeds is not None else getattr(mod, "DEFAULT_SEEDS", {}).get(protocol or NO_PROTOCOL, 1)
    if n < 1:
        raise UserError(f"--seeds {n}: need at least one run per cell")
    return Grid(task, protocol, names, rows, tuple(range(n)), Path(out), data, epochs, tuple(overrides), threads,
                device)  # fmt: skip


def _rows(mod, task: str, controllers: tuple[str, ...]) -> tuple[str, ...]:
    variants = getattr(mod, "VARIANTS", {})
    full = tuple(getattr(mod, "CONTROLLERS", ("nsac", "gmle", "mcd", "de", "der", "sdenet")))
    rows = (*full, *variants) if tuple(controllers) in ((), ("all",)) else tuple(controllers)
    bad = [r for r in rows if r not in REGISTRY and r not in variants]
    if bad:
        raise UserError(f"--controllers {', '.join(bad)}: not a controller ({', '.join(REGISTRY)}) nor a variant of "
                        f"task {task!r} ({', '.join(variants) or 'none'})")  # fmt: skip
    return rows


def cells(grid: Grid) -> list[Cell]:
    """Every cell of the grid, seeds beyond a protocol's runs (Gal's protein has 5 splits) left out."""
    mod = tasks.module(grid.task)
    variants = getattr(mod, "VARIANTS", {})
    out = []
    for dataset in grid.datasets:
        limit = len(grid.seeds)
        if hasattr(mod, "n_runs") and dataset is not None:
            limit = min(limit, mod.n_runs(dataset, grid.protocol, None if grid.data is None else Path(grid.data)))
        for row in grid.rows:
            controller, fixed = variants.get(row, (row, ()))
            for seed in grid.seeds[:limit]:
                run_dir = grid.out / "runs" / (dataset or grid.task) / row / f"seed{seed}"
                sets = [*(f"task.dataset={dataset}" for _ in [0] if dataset is not None),
                        *(f"task.protocol={grid.protocol}" for _ in [0] if grid.protocol is not None),
                        *fixed, *grid.overrides]  # fmt: skip
                out.append(Cell(dataset, row, controller, seed, run_dir, tuple(sets), _command(grid, controller,
                                seed, run_dir, sets)))  # fmt: skip
    return out


def _command(grid: Grid, controller: str, seed: int, run_dir: Path, sets: list[str]) -> str:
    words = ["drive", "train", "--task", grid.task, "--controller", controller, "--seed", str(seed),
             "--out", str(run_dir), "--threads", str(grid.threads)]  # fmt: skip
    if grid.data:
        words += ["--data", grid.data]
    if grid.epochs:
        words += ["--epochs", str(grid.epochs)]
    if sets:
        words += ["--set", *sets]
    return shlex.join(words)


def cell_state(cell: Cell) -> str:
    """Cell state: "done" (metrics.json), "partial" (resume.pt) or "new"; a run dir of another command is an error."""
    config = cell.run_dir / "config.json"
    if config.is_file():
        recorded = json.loads(config.read_text()).get("command")
        if recorded is not None and recorded != cell.command:
            raise UserError(f"{cell.run_dir} holds a run of another command ({recorded!r}); use another --out")
    if (cell.run_dir / "metrics.json").is_file():
        return "done"
    return "partial" if (cell.run_dir / "resume.pt").is_file() else "new"


def run_grid(grid: Grid, progress: bool = True) -> list[dict[str, Any]]:
    """Train every cell that is not done; returns one record per cell (status, seconds, error).

    Several processes may run the same grid: each cell is locked (RUN/lock holds the pid) while it trains and its
    state is read again just before, so a cell another process finished or is training is skipped ("busy")."""
    if grid.threads > 0:
        torch.set_num_threads(grid.threads)
    todo, records = [], []
    for cell in cells(grid):
        (records if cell_state(cell) == "done" else todo).append(cell)
    records = [_record(c, "done", 0.0) for c in records]
    bar = tqdm(todo, desc=f"bench offline {grid.task}", unit="cell", disable=not progress, dynamic_ncols=True)
    for cell in bar:
        bar.set_postfix_str(f"{cell.dataset or grid.task} {cell.row} seed {cell.seed}")
        lock = _lock(cell.run_dir)
        if lock is None:
            records.append(_record(cell, "busy", 0.0))
            continue
        try:
            records.append(_train_cell(grid, cell))
        finally:
            lock.unlink(missing_ok=True)
    return records


def _train_cell(grid: Grid, cell: Cell) -> dict[str, Any]:
    state = cell_state(cell)
    if state == "done":  # finished by another process meanwhile
        return _record(cell, "done", 0.0)
    t0 = time.perf_counter()
    request = TrainRequest(controller=cell.controller, out=cell.run_dir, task=grid.task, data=grid.data,
                           epochs=grid.epochs, seed=cell.seed, resume=state == "partial", overrides=cell.overrides,
                           device=grid.device, progress=False, command=cell.command,
                           extra={"agents_sha": AGENTS_SHA})  # fmt: skip
    try:
        try:
            train_and_evaluate(request)
        except UserError:  # an interrupted run of other controller code cannot resume: set aside, start afresh
            if state != "partial":
                raise
            cell.run_dir.rename(cell.run_dir.with_name(f"{cell.run_dir.name}.stale-{int(time.time())}"))
            log.warning("%s: could not resume (set aside as .stale-*), training afresh", cell.run_dir)
            train_and_evaluate(dataclasses.replace(request, resume=False))
        return _record(cell, "trained", time.perf_counter() - t0)
    except (FloatingPointError, RuntimeError, ValueError) as exc:
        if isinstance(exc, UserError):
            raise
        log.warning("%s failed: %s", cell.run_dir, exc)
        return _record(cell, "failed", time.perf_counter() - t0, traceback.format_exception_only(exc))


def _lock(run_dir: Path) -> Path | None:
    """RUN/lock created exclusively with our pid; None while a live process holds it (a dead one's is taken)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "lock"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                os.kill(int(path.read_text() or 0), 0)
                return None  # held by a live process
            except (ProcessLookupError, ValueError, FileNotFoundError):
                path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            except PermissionError:
                return None
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return path
    return None


def status_record(cell: Cell) -> dict[str, Any]:
    """A cell's record without training it ("done" or "not run")."""
    return _record(cell, "done" if cell_state(cell) == "done" else "not run", 0.0)


def _record(cell: Cell, status: str, seconds: float, error: list[str] | None = None) -> dict[str, Any]:
    return {"dataset": cell.dataset, "row": cell.row, "controller": cell.controller, "seed": cell.seed,
            "run_dir": str(cell.run_dir), "command": cell.command, "status": status, "seconds": seconds,
            **({"error": "".join(error).strip()} if error else {})}  # fmt: skip


# -- aggregation -------------------------------------------------------------------------------------------------------
def _stats(values: list[float]) -> dict[str, Any]:
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return {"mean": None, "std": None, "n": 0}
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return {"mean": float(arr.mean()), "std": std, "n": int(arr.size)}


def _reports(metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The test sets of one run: "" -> metrics.json["test"], name -> metrics.json["tests"][name]."""
    out = {"": metrics["test"]} if isinstance(metrics.get("test"), dict) else {}
    out.update(metrics.get("tests", {}))
    return out


def aggregate(grid: Grid) -> dict[str, Any]:
    """results.json's dict: one table per (dataset, test set) with mean / std over runs, paper, references."""
    mod = tasks.module(grid.task)
    paper = getattr(mod, "PAPER", {}).get(grid.protocol or NO_PROTOCOL, {})
    grid_cells = cells(grid)
    tables = []
    for dataset in grid.datasets:
        runs: dict[str, list[tuple[Cell, dict]]] = {}
        for cell in grid_cells:
            if cell.dataset == dataset and (cell.run_dir / "metrics.json").is_file():
                runs.setdefault(cell.row, []).append((cell, json.loads((cell.run_dir / "metrics.json").read_text())))
        names = list(dict.fromkeys(n for row in runs.values() for _, m in row for n in _reports(m)))
        for name in names:
            key = (dataset or grid.task) + (f"/{name}" if name else "")
            tables.append(_table(grid, dataset, name, key, runs, paper.get(key, {})))
    return {"task": grid.task, "protocol": grid.protocol, "datasets": list(grid.datasets), "rows": list(grid.rows),
            "seeds": list(grid.seeds), "tables": tables, "paper_source": getattr(mod, "PAPER_SOURCES", {}).get(
            grid.protocol or NO_PROTOCOL), "report_plots": list(getattr(mod, "REPORT_PLOTS", ("reliability", "pit"))),
            "threads": grid.threads, "summary": _summary(mod, grid_cells)}  # fmt: skip


def _summary(mod, grid_cells: list[Cell]) -> dict[str, Any] | None:
    """The task's own summary of the finished runs (its `summary(runs)`: extra tables and the paper's claims)."""
    if not hasattr(mod, "summary"):
        return None
    runs = [{"dataset": c.dataset, "row": c.row, "seed": c.seed, "metrics": json.loads((c.run_dir /
             "metrics.json").read_text())} for c in grid_cells if (c.run_dir / "metrics.json").is_file()]  # fmt: skip
    return mod.summary(runs)


def _table(grid: Grid, dataset: str | None, name: str, key: str, runs: dict, paper: dict) -> dict[str, Any]:
    rows, references, notes = [], {}, []
    for row in grid.rows:
        found = [(c, _reports(m)[name], m) for c, m in runs.get(row, []) if name in _reports(m)]
        if not found:
            continue
        stats = {k: _stats([r.get(k) for _, r, _ in found]) for k in METRICS}
        stats.update({k: _stats([m["fit"].get(v) for _, _, m in found]) for k, v in TIMES.items()})
        extra = {k: [r[k] for _, r, _ in found] for k in ("beats_last_value",) if k in found[0][1]}
        rows.append({"row": row, "controller": found[0][0].controller, "metrics": stats,
                     "paper": paper.get(row, {}), "seeds": [c.seed for c, _, _ in found],
                     "run_dirs": [str(c.run_dir) for c, _, _ in found], "command": found[0][0].command,
                     **extra})  # fmt: skip
        for _, report, _ in found:
            for ref, values in report.get("references", {}).items():
                references.setdefault(ref, []).append(values)
        versions = {json.loads((c.run_dir / "config.json").read_text()).get("agents_sha") for c, _, _ in found}
        if len(versions) > 1:
            notes.append(f"{row}: runs of {len(versions)} versions of agents/ (retrain the older ones)")
        first = found[0][1]
        for note in (f"units: {first['units']}" if "units" in first else None,
                     f"data year: {first['year']}" if first.get("year") else None):  # fmt: skip
            if note and note not in notes:
                notes.append(note)
    refs = [{"row": ref, "metrics": {k: _stats([v.get(k) for v in values]) for k in METRICS if k in values[0]}}
            for ref, values in references.items()]  # fmt: skip
    return {"key": key, "dataset": dataset, "test": name or "test", "notes": notes, "rows": rows, "references": refs,
            "paper_rows": {r: v for r, v in paper.items() if r not in {x["row"] for x in rows}}}  # fmt: skip
