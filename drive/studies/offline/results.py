"""The offline benchmark's tables: each grid cell's metrics.json aggregated (drive/studies/offline/grid.py runs the
cells).

    results = aggregate(grid)   # {"tables": [...], "task", "protocol", "paper_source", "report_plots", "summary", ...}

One table per (dataset, test set): metrics.json["test"] is the dataset's headline table (key = the dataset), each
metrics.json["tests"][name] another (key "dataset/name"). A row holds mean / std (ddof 1) / n over its runs of
METRICS and the times, the paper's numbers for that row (the task's PAPER[protocol][key][row]), its seeds, run
directories and one cell's command; the table holds the reference rows the reports carry (mean over runs), the
paper's rows we did not run, and notes (units, data year, a row mixing controller-code versions). A task module
with `summary(runs)` adds its own summary (the SA study).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from drive.learn import tasks
from drive.studies.offline.grid import NO_PROTOCOL, Cell, Grid, cells

METRICS = ("mse", "rmse", "mae", "nll", "crps", "ece", "pit_w1", "coverage_90", "width_90")
TIMES = {"train_s": "train_seconds", "infer_s": "eval_seconds"}


def _stats(values: list[float | None]) -> dict[str, Any]:
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
    return {
        "task": grid.task,
        "protocol": grid.protocol,
        "datasets": list(grid.datasets),
        "rows": list(grid.rows),
        "seeds": list(grid.seeds),
        "tables": tables,
        "paper_source": getattr(mod, "PAPER_SOURCES", {}).get(grid.protocol or NO_PROTOCOL),
        "report_plots": list(getattr(mod, "REPORT_PLOTS", ("reliability", "pit"))),
        "threads": grid.threads,
        "summary": _summary(mod, grid_cells),
    }


def _summary(mod, grid_cells: list[Cell]) -> dict[str, Any] | None:
    """The task's own summary of the finished runs (its `summary(runs)`: extra tables and the paper's claims)."""
    if not hasattr(mod, "summary"):
        return None
    runs = [
        {
            "dataset": c.dataset,
            "row": c.row,
            "seed": c.seed,
            "metrics": json.loads((c.run_dir / "metrics.json").read_text()),
        }
        for c in grid_cells
        if (c.run_dir / "metrics.json").is_file()
    ]
    return mod.summary(runs)


def _table(grid: Grid, dataset: str | None, name: str, key: str, runs: dict, paper: dict) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    references: dict[str, list[dict[str, Any]]] = {}
    notes: list[str] = []
    for row in grid.rows:
        found = [(c, _reports(m)[name], m) for c, m in runs.get(row, []) if name in _reports(m)]
        if not found:
            continue
        stats = {k: _stats([r.get(k) for _, r, _ in found]) for k in METRICS}
        stats.update({k: _stats([m["fit"].get(v) for _, _, m in found]) for k, v in TIMES.items()})
        extra = {k: [r[k] for _, r, _ in found] for k in ("beats_last_value",) if k in found[0][1]}
        rows.append(
            {
                "row": row,
                "controller": found[0][0].controller,
                "metrics": stats,
                "paper": paper.get(row, {}),
                "seeds": [c.seed for c, _, _ in found],
                "run_dirs": [str(c.run_dir) for c, _, _ in found],
                "command": found[0][0].command,
                **extra,
            }
        )
        for _, report, _ in found:
            for ref, values in report.get("references", {}).items():
                references.setdefault(ref, []).append(values)
        note = _versions_note(row, [json.loads((c.run_dir / "config.json").read_text()) for c, _, _ in found])
        if note:
            notes.append(note)
        first = found[0][1]
        for note in (
            f"units: {first['units']}" if "units" in first else None,
            f"data year: {first['year']}" if first.get("year") else None,
        ):
            if note and note not in notes:
                notes.append(note)
    refs = [
        {"row": ref, "metrics": {k: _stats([v.get(k) for v in values]) for k in METRICS if k in values[0]}}
        for ref, values in references.items()
    ]
    return {
        "key": key,
        "dataset": dataset,
        "test": name or "test",
        "notes": notes,
        "rows": rows,
        "references": refs,
        "paper_rows": {r: v for r, v in paper.items() if r not in {x["row"] for x in rows}},
    }


def _versions_note(row: str, configs: list[dict[str, Any]]) -> str | None:
    """Where a row's runs ran different agents/ code: how many versions, and the files that differ between them
    (from the per-file shas cells record; runs from before those were recorded are counted, not compared)."""
    versions = {c.get("agents_sha") for c in configs}
    if len(versions) <= 1:
        return None
    files = [c["agents_files"] for c in configs if isinstance(c.get("agents_files"), dict)]
    differ = sorted({f for a in files for b in files for f in set(a) | set(b) if a.get(f) != b.get(f)})
    unknown = len(configs) - len(files)
    parts = [f"differing in {', '.join(differ)}"] if differ else []
    parts += [f"{unknown} run(s) from before per-file records"] if unknown else []
    parts.append(f"`--refresh {row}` retrains the older ones")
    return f"{row}: runs of {len(versions)} versions of agents/ ({'; '.join(parts)})"
