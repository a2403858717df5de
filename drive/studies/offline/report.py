"""The offline benchmark report: DIR/results.json, DIR/results.md and DIR/plots/ from `drive.studies.offline.grid`'s
results.

    write_report(results, out, command="drive bench offline ...") -> [results.json, results.md, plots...]

Generic over tasks: one markdown table per (dataset, test set) of `results["tables"]`; rows are the grid's rows
(controllers or task variants) as mean ± std over runs, the paper's number beside ours in the same cell
(`0.0301 ± 0.0012 [paper 0.030]`), then the reference rows a task reports (naive forecasts, the train-mean
predictor) and the paper's rows we did not run. Best per column in bold among our rows: the lowest value, except
coverage_90 (closest to 0.90). The pooled plots (drive/studies/offline/plots.py) are those the task names in
REPORT_PLOTS, drawn from each run's predictions.npz / trajectory.npz. A task's own summary (results["summary"]:
extra tables and the paper's claims marked reproduced or not) follows the tables. The report ends with the
environment and the exact `drive train` command of one cell per row, so anyone reruns a cell.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from datasets.files import atomic_write
from datasets.root import REPO
from drive.studies.offline import plots as report_plots

COLUMNS = {"mse": "MSE", "rmse": "RMSE", "mae": "MAE", "nll": "NLL", "crps": "CRPS", "ece": "ECE",
           "pit_w1": "PIT-W1", "coverage_90": "cov90", "width_90": "width90", "train_s": "train s",
           "infer_s": "eval s"}  # fmt: skip
DEFINITIONS = (
    "MSE / RMSE / MAE of the predictive mean; NLL: mean Gaussian negative log-likelihood with the full constant, "
    "0.5 log(2 pi var) + (y - mean)^2 / (2 var), total (aleatoric + epistemic) variance; CRPS: closed-form Gaussian "
    "CRPS (point forecasts: MAE); ECE: for quantile levels p = 0.05, 0.10, ..., 0.95 the mean |freq(PIT <= p) - p| "
    "(Kuleshov et al. 2018; 0 calibrated, 0.5 worst); PIT-W1: Wasserstein-1 distance of the PIT values to U(0, 1); "
    "cov90 / width90: share of targets inside, and mean width of, the central 90 % interval mean +- 1.645 sigma; "
    "train s: training wall time; eval s: the held-out evaluation's wall time (test predictions with the "
    "controller's default samples and the task's metrics). Mean ± std (ddof 1) over runs (seeds / splits); "
    "bold: best of our rows (lowest; cov90: closest to 0.90)."
)


def _fmt(value: float | None, std: float | None = None) -> str:
    if value is None:
        return "-"
    text = f"{value:.4g}"
    return text if std is None else f"{text} ± {std:.2g}"


def _best(rows: list[dict], key: str) -> float | None:
    values = [r["metrics"][key]["mean"] for r in rows if r["metrics"].get(key, {}).get("mean") is not None]
    if not values:
        return None
    return min(values, key=lambda v: abs(v - 0.9)) if key == "coverage_90" else min(values)


def table_markdown(table: dict[str, Any]) -> list[str]:
    keys = [k for k in COLUMNS if any(r["metrics"].get(k, {}).get("n") for r in table["rows"])]
    title = f"### {table['key']}" + (f" ({'; '.join(table['notes'])})" if table["notes"] else "")
    lines = [
        title,
        "",
        "| row | runs | " + " | ".join(COLUMNS[k] for k in keys) + " |",
        "|---|---|" + "---|" * len(keys),
    ]
    best = {k: _best(table["rows"], k) for k in keys}
    for row in table["rows"]:
        cells = []
        for k in keys:
            stat = row["metrics"].get(k, {})
            text = _fmt(stat.get("mean"), stat.get("std"))
            if stat.get("mean") is not None and stat["mean"] == best[k] and len(table["rows"]) > 1:
                text = f"**{text}**"
            if k in row.get("paper", {}):
                text += f" [paper {row['paper'][k]:.4g}]"
            cells.append(text)
        flags = row.get("beats_last_value")
        name = row["row"] + ("" if flags is None else " (beats last value)" if all(flags) else " (LOSES to last value)")
        lines.append(f"| {name} | {len(row['seeds'])} | " + " | ".join(cells) + " |")
    for ref in table["references"]:
        cells = [_fmt(ref["metrics"].get(k, {}).get("mean")) for k in keys]
        lines.append(f"| *reference: {ref['row'].replace('_', ' ')}* | - | " + " | ".join(cells) + " |")
    for row, values in table.get("paper_rows", {}).items():
        cells = [_fmt(values.get(k)) for k in keys]
        lines.append(f"| *paper: {row}* (not run) | - | " + " | ".join(cells) + " |")
    return [*lines, ""]


def summary_markdown(summary: dict[str, Any] | None) -> list[str]:
    """A task's own summary (drive/studies/offline/grid.py `summary`): its tables, then the paper's claims, each
    marked."""
    if not summary:
        return []
    lines = []
    for table in summary.get("tables", []):
        lines += [
            f"### {table['title']}",
            "",
            *([table["note"], ""] if table.get("note") else []),
            "| " + " | ".join(table["columns"]) + " |",
            "|" + "---|" * len(table["columns"]),
            *("| " + " | ".join(row) + " |" for row in table["rows"]),
            "",
        ]
    if summary.get("claims"):
        lines += ["### The paper's claims", "", "| claim | paper | ours | reproduced |", "|---|---|---|---|"]
        marks = {True: "yes", False: "**no**", None: "undecided (not every dataset run)"}
        lines += [
            f"| {c['claim']} | {c['paper']} | {c['ours']} | {marks[c['reproduced']]} |" for c in summary["claims"]
        ]
        lines.append("")
    return lines


def markdown(results: dict[str, Any], plots: list[Path], out: Path, command: str) -> str:
    head = f"task {results['task']}" + (f", protocol {results['protocol']}" if results["protocol"] else "")
    lines = [f"# drive bench offline: {head}", "", f"Command: `{command}`", ""]
    if results.get("paper_source"):
        lines += [f"Paper numbers: {results['paper_source']}; shown as [paper x] beside ours.", ""]
    failed = [c for c in results.get("cells", []) if c["status"] == "failed"]
    missing = [c for c in results.get("cells", []) if c["status"] not in ("done", "trained", "failed")]
    lines += [
        f"Cells: {len(results.get('cells', []))} ({len(failed)} failed, {len(missing)} not run).",
        "",
        f"Metrics: {DEFINITIONS}",
        "",
    ]
    for table in results["tables"]:
        lines += table_markdown(table)
    lines += summary_markdown(results.get("summary"))
    for cell in failed:
        lines.append(f"- failed: `{cell['run_dir']}`: {cell.get('error', '')}")
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{p.stem}]({os.path.relpath(p, out)})" for p in plots]
    env = results.get("environment", {})
    lines += [
        "",
        "## Rerun one cell",
        "",
        "Each cell is this `drive train` command (other cells: another `--seed` = "
        "the protocol's split / run, another `task.dataset`); its run directory holds config.json, metrics.json "
        "and predictions.npz.",
        "",
    ]
    for table in results["tables"][:1]:
        lines += [f"- {row['row']}: `{row['command']}`" for row in table["rows"]]
    lines += ["", "## Environment", "", *(f"- {k}: {v}" for k, v in env.items()), ""]
    return "\n".join(lines)


def write_report(results: dict[str, Any], out: Path, command: str = "") -> list[Path]:
    """results.json, plots/ and results.md in `out`; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots = report_plots.draw(results, out / "plots")
    results = {
        "environment": environment(results.get("threads", 1)),
        **results,
        "command": command,
        "plots": [str(Path(p).relative_to(out)) for p in plots],
    }  # relative: no machine path
    atomic_write(out / "results.json", json.dumps(results, indent=2).encode())
    atomic_write(out / "results.md", markdown(results, plots, out, command).encode())
    return [out / "results.json", out / "results.md", *plots]


def environment(threads: int) -> dict[str, Any]:
    """What the numbers ran on: versions, CPU, threads, the checkout's commit."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, cwd=REPO
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
