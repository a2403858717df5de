"""`drive bench offline`: one command per table of the offline tasks, every controller on every dataset and seed.

    drive bench offline --task uci --protocol gal --datasets boston concrete --out runs/bench-uci-gal
    drive bench offline --task uci --protocol nsac --datasets boston kin8nm --out runs/bench-uci-nsac
    drive bench offline --task forecast --protocol paper --datasets ettm1 jena --out runs/bench-fc-paper
    drive bench offline --task spiral --out runs/bench-spiral            # NSAC with and without its regulariser
    drive bench offline --task uci --protocol gal --seeds 20 --datasets ... --out DIR     # the full Gal protocol

Interface (for every task in drive/learn/tasks, see drive/studies/offline/grid.py for what a task module contributes):
- `--task T` picks the task; `--protocol P` and `--datasets D ...` its Options fields `protocol` / `dataset`
  (default: the task's defaults); `--controllers all` (default) is the task's CONTROLLERS, or name controllers
  (agents/registry.py) and task VARIANTS; `--seeds N` runs seeds 0..N-1 (default: the task's DEFAULT_SEEDS for the
  protocol); `--epochs`, `--set KEY=VALUE ...` and `--data` pass through to every cell (`drive train` options).
- Each cell is DIR/runs/<dataset>/<row>/seed<s>, a `drive train` run directory; rerunning the same command
  resumes (finished cells kept, an interrupted one resumed from its last epoch); `--report-only` rebuilds the
  report from the cells already finished without training any; `--refresh nsac` retrains the finished cells of
  those rows that ran other controller code (each cell records the sha of agents/; older runs are kept aside).
- Writes DIR/results.json (the tables: mean / std over runs, the paper's numbers, the references; every cell's
  command and status; the environment), DIR/results.md (one table per dataset and test set, the paper's number
  beside ours, best per column in bold, the plots, the commands to rerun one cell) and DIR/plots/*.png.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from drive.options import PositiveInt

RESUMES = True  # rerunning the same command continues what an interrupted run left


@dataclass(frozen=True)
class Config:
    task: str
    """offline task: uci, forecast, spiral (or any task in drive/learn/tasks)"""
    out: Path
    """benchmark directory: runs/ (one run directory per cell), results.json, results.md, plots/"""
    protocol: str | None = None
    """the task's protocol (uci: gal, nsac; forecast: paper, authors, informer; default: the task's)"""
    datasets: tuple[str, ...] = ()
    """datasets by lower-case name (uci: boston, kin8nm, ...; forecast: ettm1, jena; default: the task's)"""
    controllers: tuple[str, ...] = ("all",)
    """table rows: all (the task's controllers) or controller / variant names"""
    seeds: PositiveInt | None = None
    """runs per cell, seeds 0..N-1 = the protocol's splits (default: the task's first-run count)"""
    epochs: PositiveInt | None = None
    """maximum epochs of every cell (default: the task's)"""
    set: tuple[str, ...] = ()
    """KEY=VALUE overrides for every cell (as drive train --set)"""
    data: str | None = None
    """the task's --data (the data root for uci / forecast; default: the data root rule)"""
    threads: PositiveInt = 1
    """torch CPU threads per run"""
    device: str = "cpu"
    """torch device"""
    refresh: tuple[str, ...] = ()
    """rows (or all) whose finished cells ran other agents/ code: set aside (RUN.stale-*) and trained again"""
    report_only: bool = False
    """train nothing: tables and plots from the cells already finished"""
    progress: bool = True
    """show the progress bar"""


def run(cfg: Config) -> int:
    from drive.studies.offline import grid as offline
    from drive.studies.offline import (
        results as offline_results,  # torch: imported when the command runs, not for `--help`
    )
    from drive.studies.offline.report import write_report

    grid = offline.make_grid(
        cfg.task,
        protocol=cfg.protocol,
        datasets=cfg.datasets,
        controllers=cfg.controllers,
        seeds=cfg.seeds,
        out=cfg.out,
        data=cfg.data,
        epochs=cfg.epochs,
        overrides=cfg.set,
        threads=cfg.threads,
        device=cfg.device,
        refresh=cfg.refresh,
    )
    plan = offline.cells(grid)
    done = sum(offline.cell_state(c) == "done" for c in plan)
    print(f"{len(plan)} cells ({done} done) -> {cfg.out}")
    if cfg.report_only:
        records = [offline.status_record(c) for c in plan]
    else:
        records = offline.run_grid(grid, progress=cfg.progress)
    results = {**offline_results.aggregate(grid), "cells": records}
    argv = sys.argv[3:] if sys.argv[1:3] == ["bench", "offline"] else []
    command = "drive bench offline " + shlex.join(argv) if argv else f"drive bench offline --task {cfg.task}"
    paths = write_report(results, cfg.out, command)
    failed = [r for r in records if r["status"] == "failed"]
    for table in results["tables"]:
        if table["test"] == "test":
            best = [
                f"{r['row']} {r['metrics']['nll']['mean']:.4g}"
                for r in table["rows"]
                if r["metrics"]["nll"]["mean"] is not None
            ]
            print(f"{table['key']}: nll {', '.join(best)}")
    print(f"wrote {paths[1]} ({len(paths) - 2} plots){f'; {len(failed)} cells failed' if failed else ''}")
    return 1 if failed else 0
