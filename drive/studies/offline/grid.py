"""Offline benchmark grids: every (dataset, controller, seed) cell of a task trained and evaluated, then aggregated.

    grid = make_grid("uci", protocol="gal", datasets=("boston",), controllers=("all",), seeds=3, out=Path(DIR))
    run_grid(grid)                    # trains the cells that have no metrics.json yet (progress bar with ETA)
    results = offline_results.aggregate(grid)   # the tables: mean / std over runs, the paper's numbers, references

Each cell is one `drive.learn.experiment.train_and_evaluate` run in DIR/runs/<dataset>/<row>/seed<s>, identical to
the `drive train` command recorded with it (`Cell.command`). The run directory with its metrics.json is the record:
a killed grid rerun with the same arguments keeps every finished cell, resumes an interrupted one from its
resume.pt, and trains the rest; a run directory written by another command (other overrides or epochs) is an error
rather than a silent mix. A cell that fails (a diverged run) is recorded with its error and retried on the next run.
Each cell records the sha of the agents/ code it ran (config.json "agents_sha", and "agents_files" per file: the
report names the files in which a row's runs differ); an interrupted cell that cannot
resume (the controller changed since) and, with `refresh=ROWS`, a finished cell of those rows that ran other code
are set aside as RUN.stale-<time> and trained afresh. Several processes may share a grid (cells are locked).

What a task module contributes (drive/learn/tasks/__init__.py documents the contract; all optional but Options):
DATASETS / PROTOCOLS (the Options fields `dataset` / `protocol` select one; a task without them is one table),
CONTROLLERS (registry names: the rows `--controllers all` runs, then every VARIANT), VARIANTS ({row:
(controller, overrides)}: a row that is a controller with fixed `--set` overrides, e.g. spiral's NSAC without its
regulariser), NAMED_VARIANTS (the same, run only when `--controllers` names them: an ablation), DEFAULT_SEEDS
({protocol: n}), n_runs(dataset, protocol, root) (the most runs a protocol has), PAPER ({protocol: {table key:
{row: {metric: value}}}}, the table key being the dataset for its headline test set and "dataset/name" for metrics.json
"tests"[name]; "default" stands for the protocol of a task without one), PAPER_SOURCES ({protocol: citation}),
REPORT_PLOTS (which pooled plots drive/studies/offline/report.py draws), summary(runs) (a task's own tables and claims
over the finished runs, [{"dataset", "row", "seed", "metrics"}] -> {"tables": [{"title", "note", "columns", "rows"}],
"claims": [{"id", "claim", "paper", "ours", "reproduced"}]}, results.json "summary", rendered by the report).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shlex
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from tqdm.auto import tqdm

from agents.registry import CONTROLLERS as REGISTRY
from datasets.root import REPO, portable_command
from drive.errors import UserError
from drive.learn import tasks
from drive.learn.experiment import TrainRequest, train_and_evaluate

log = logging.getLogger(__name__)

NO_PROTOCOL = "default"
# the controller code a cell ran, recorded in RUN/config.json: the sha256 of agents/**/*.py and one per file, so a row
# mixing versions says which files differ between its runs
_AGENTS = REPO / "agents"
_AGENTS_BYTES = {p.relative_to(_AGENTS.parent).as_posix(): p.read_bytes() for p in sorted(_AGENTS.rglob("*.py"))}
AGENTS_SHA = hashlib.sha256(b"".join(_AGENTS_BYTES.values())).hexdigest()[:12]
AGENTS_FILES = {name: hashlib.sha256(data).hexdigest()[:12] for name, data in _AGENTS_BYTES.items()}


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
    refresh: tuple[str, ...] = ()  # rows whose finished cells are retrained when they ran other agents/ code


def task_attr(task: str, name: str, default: Any = None) -> Any:
    return getattr(tasks.module(task), name, default)


def make_grid(
    task: str,
    *,
    protocol: str | None = None,
    datasets: tuple[str, ...] = (),
    controllers: tuple[str, ...] = ("all",),
    seeds: int | None = None,
    out: Path,
    data: str | None = None,
    epochs: int | None = None,
    overrides: tuple[str, ...] = (),
    threads: int = 1,
    device: str = "cpu",
    refresh: tuple[str, ...] = (),
) -> Grid:
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
    return Grid(
        task,
        protocol,
        names,
        rows,
        tuple(range(n)),
        Path(out),
        data,
        epochs,
        tuple(overrides),
        threads,
        device,
        tuple(rows if tuple(refresh) == ("all",) else refresh),
    )


def _variants(mod) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The task's VARIANTS (rows of `all`) and NAMED_VARIANTS (rows run only when named, e.g. an ablation)."""
    return {**getattr(mod, "NAMED_VARIANTS", {}), **getattr(mod, "VARIANTS", {})}


def _rows(mod, task: str, controllers: tuple[str, ...]) -> tuple[str, ...]:
    variants = _variants(mod)
    full = tuple(getattr(mod, "CONTROLLERS", ("nsac", "gmle", "mcd", "de", "der", "sdenet")))
    # a variant may share its controller's name (sa-uci's ft-swag trains differently): such a row is listed once
    every = (*full, *getattr(mod, "VARIANTS", {}))
    rows = tuple(dict.fromkeys(r for c in controllers or ("all",) for r in (every if c == "all" else (c,))))
    bad = [r for r in rows if r not in REGISTRY and r not in variants]
    if bad:
        raise UserError(
            f"--controllers {', '.join(bad)}: not a controller ({', '.join(REGISTRY)}) nor a variant of "
            f"task {task!r} ({', '.join(variants) or 'none'})"
        )
    return rows


def cells(grid: Grid) -> list[Cell]:
    """Every cell of the grid, seeds beyond a protocol's runs (Gal's protein has 5 splits) left out."""
    mod = tasks.module(grid.task)
    variants = _variants(mod)
    out = []
    for dataset in grid.datasets:
        limit = len(grid.seeds)
        if hasattr(mod, "n_runs") and dataset is not None:
            limit = min(limit, mod.n_runs(dataset, grid.protocol, None if grid.data is None else Path(grid.data)))
        for row in grid.rows:
            controller, fixed = variants.get(row, (row, ()))
            for seed in grid.seeds[:limit]:
                run_dir = grid.out / "runs" / (dataset or grid.task) / row / f"seed{seed}"
                sets = [
                    *(f"task.dataset={dataset}" for _ in [0] if dataset is not None),
                    *(f"task.protocol={grid.protocol}" for _ in [0] if grid.protocol is not None),
                    *fixed,
                    *grid.overrides,
                ]
                out.append(
                    Cell(
                        dataset,
                        row,
                        controller,
                        seed,
                        run_dir,
                        tuple(sets),
                        _command(grid, controller, seed, run_dir, sets),
                    )
                )
    return out


def _command(grid: Grid, controller: str, seed: int, run_dir: Path, sets: list[str]) -> str:
    words = [
        "drive",
        "train",
        "--task",
        grid.task,
        "--controller",
        controller,
        "--seed",
        str(seed),
        "--out",
        str(run_dir),
        "--threads",
        str(grid.threads),
    ]
    if grid.data:
        words += ["--data", grid.data]
    if grid.epochs:
        words += ["--epochs", str(grid.epochs)]
    if sets:
        words += ["--set", *sets]
    return shlex.join(words)


DISPLAY_ONLY = ("--progress", "--no-progress")  # flags that change what is shown, never what is trained


def _run_words(command: str) -> list[str]:
    """A train command's words as a run is identified by them: portable paths, display-only flags left out (a run
    trained with --no-progress is the run the grid would train)."""
    return [w for w in shlex.split(portable_command(command)) if w not in DISPLAY_ONLY]


def cell_state(cell: Cell) -> str:
    """Cell state: "done" (metrics.json), "partial" (resume.pt) or "new"; a run dir of another command is an error."""
    config = cell.run_dir / "config.json"
    if config.is_file():
        recorded = json.loads(config.read_text()).get("command")
        if recorded is not None and _run_words(recorded) != _run_words(cell.command):
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
    todo: list[Cell] = []
    finished: list[Cell] = []
    for cell in cells(grid):
        done = cell_state(cell) == "done"
        if done and cell.row in grid.refresh and _recorded(cell, "agents_sha") != AGENTS_SHA:
            _set_aside(cell.run_dir, "ran other agents/ code (--refresh)")
            done = False
        (finished if done else todo).append(cell)
    todo.sort(key=lambda c: c.seed)  # every row's first seed before any row's second: a partial grid compares rows
    records = [_record(c, "done", 0.0) for c in finished]
    bar = tqdm(todo, desc=f"bench offline {grid.task}", unit="cell", disable=not progress, dynamic_ncols=True)
    for cell in bar:
        bar.set_postfix_str(f"{cell.dataset or grid.task} {cell.row} seed {cell.seed}")
        held = lock(cell.run_dir)
        if held is None:
            records.append(_record(cell, "busy", 0.0))
            continue
        try:
            records.append(_train_cell(grid, cell))
        finally:
            held.unlink(missing_ok=True)
    return records


def _train_cell(grid: Grid, cell: Cell) -> dict[str, Any]:
    state = cell_state(cell)
    if state == "done":  # finished by another process meanwhile
        return _record(cell, "done", 0.0)
    if state == "partial" and _recorded(cell, "agents_sha") not in (None, AGENTS_SHA):
        _set_aside(cell.run_dir, "interrupted under other agents/ code")  # resuming would mix controller versions
        state = "new"
    t0 = time.perf_counter()
    request = TrainRequest(
        controller=cell.controller,
        out=cell.run_dir,
        task=grid.task,
        data=grid.data,
        epochs=grid.epochs,
        seed=cell.seed,
        resume=state == "partial",
        overrides=cell.overrides,
        device=grid.device,
        progress=False,
        command=cell.command,
        extra={"agents_sha": AGENTS_SHA, "agents_files": AGENTS_FILES},
    )
    try:
        try:
            train_and_evaluate(request)
        except UserError:  # an interrupted run of other controller code cannot resume: set aside, start afresh
            if state != "partial":
                raise
            _set_aside(cell.run_dir, "could not resume")
            train_and_evaluate(dataclasses.replace(request, resume=False))
        return _record(cell, "trained", time.perf_counter() - t0)
    except (FloatingPointError, RuntimeError, ValueError) as exc:
        if isinstance(exc, UserError):
            raise
        log.warning("%s failed: %s", cell.run_dir, exc)
        return _record(cell, "failed", time.perf_counter() - t0, traceback.format_exception_only(exc))


def _recorded(cell: Cell, key: str) -> Any:
    config = cell.run_dir / "config.json"
    return json.loads(config.read_text()).get(key) if config.is_file() else None


def _set_aside(run_dir: Path, why: str) -> None:
    """Rename a run directory to RUN.stale-<time> (kept, never deleted) so the cell trains afresh."""
    run_dir.rename(run_dir.with_name(f"{run_dir.name}.stale-{time.time_ns()}"))
    log.warning("%s: %s; set aside as %s.stale-*, training afresh", run_dir, why, run_dir.name)


def lock(run_dir: Path, name: str = "lock") -> Path | None:
    """RUN/<name> created exclusively with our pid; None while a live process holds it (a dead one's is taken)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / name
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
    return {
        "dataset": cell.dataset,
        "row": cell.row,
        "controller": cell.controller,
        "seed": cell.seed,
        "run_dir": str(cell.run_dir),
        "command": cell.command,
        "status": status,
        "seconds": seconds,
        **({"error": "".join(error).strip()} if error else {}),
    }
