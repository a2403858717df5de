"""What each run of `drive bench controllers` cost and whether it converged: OUT/budget.json, OUT/budget.md and one
learning-curve figure per row, OUT/curves/<row>.png; with several --split-seeds, OUT/splits.md (the split's share of
the spread over runs).

Per row and seed, from the run's metrics.json ("fit", drive/learn/experiment.py) and metrics.jsonl (one line per
epoch): epochs run of the cap (--epochs), the epoch best.pt kept, what stopped it (`patience`: early stopping, the
run converged by that rule; `cap`: it ran every epoch it was allowed, so it is flagged "not converged"), the optimizer
steps taken, the trainer's CPU-seconds, the wall seconds and the trainable parameters; and the curve (train loss and
the validation score that selects best.pt, per epoch). A run written before a field was recorded shows "—" for it.
With patience 0 (the fixed budget of the reference recipe) every run trains to the cap: a budget, not convergence.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from datasets.files import atomic_write
from drive.studies.offline import grid as offline

NOT_CONVERGED = "not converged"


def _read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _curve(run_dir: Path, select: str) -> dict[str, list[float]]:
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return {
        "epoch": [int(r["epoch"]) for r in rows],
        "train_loss": [float(r["train_loss"]) for r in rows],
        select: [float(r.get(select, math.nan)) for r in rows],
    }


def record(cell: offline.Cell) -> dict[str, Any] | None:
    """One finished run's budget record (None while it has no metrics.json)."""
    metrics = _read(cell.run_dir / "metrics.json")
    if metrics is None:
        return None
    fit = metrics.get("fit", {})
    trainer = (_read(cell.run_dir / "config.json") or {}).get("trainer", {})
    cap = fit.get("max_epochs", trainer.get("epochs"))
    stopped = fit.get("stopped_by") or ("patience" if fit.get("stopped_early") else "cap")
    select = fit.get("select", "val_nll")
    return {
        "row": cell.row,
        "seed": cell.seed,
        "epochs_run": fit.get("epochs_run"),
        "max_epochs": cap,
        "best_epoch": fit.get("best_epoch"),
        "patience": fit.get("patience", trainer.get("patience")),
        "stopped_by": stopped,
        "converged": stopped == "patience",
        "gradient_steps": fit.get("gradient_steps"),
        "cpu_seconds": fit.get("cpu_seconds"),
        "train_seconds": fit.get("train_seconds"),
        "n_parameters": fit.get("n_trainable_parameters", fit.get("n_parameters")),
        "select": select,
        "curve": _curve(cell.run_dir, select),
    }


def _mean(values: Iterable[Any]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def collect(grid: offline.Grid) -> dict[str, Any]:
    """budget.json's dict: {"rows": {row: {"runs": [record per finished seed], "mean": {...}, "not_converged": n}}}."""
    rows: dict[str, dict[str, Any]] = {}
    for cell in offline.cells(grid):
        rec = record(cell)
        if rec is None:
            continue
        entry = rows.setdefault(cell.row, {"runs": []})
        entry["runs"].append(rec)
    for entry in rows.values():
        runs = entry["runs"]
        entry["mean"] = {
            key: _mean(r[key] for r in runs)
            for key in ("epochs_run", "best_epoch", "gradient_steps", "cpu_seconds", "train_seconds", "n_parameters")
        }
        entry["not_converged"] = sum(not r["converged"] for r in runs)
    return {"rows": rows}


def _num(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:,.{digits}f}"


def cost(mean: dict[str, Any]) -> str:
    """The table's cost column: gradient steps · CPU-s · parameters (means over seeds)."""
    return f"{_num(mean['gradient_steps'])} steps · {_num(mean['cpu_seconds'])} CPU-s · {_num(mean['n_parameters'])}"


def markdown(budget: dict[str, Any]) -> str:
    out = [
        "# Training budget and convergence per row",
        "",
        "Each row: means over its finished seeds. stopped: `patience` (early stopping ended the run: converged by "
        f"that rule) or `cap` (it ran every epoch it was allowed: {NOT_CONVERGED}). Cost: optimizer steps, the "
        "trainer's CPU-seconds (training and per-epoch validation) and trainable parameters. Learning curves: "
        "curves/<row>.png.",
        "",
        "| row | seeds | epochs run (cap) | best epoch | converged | cost: steps · CPU-s · params |",
        "|---|---|---|---|---|---|",
    ]
    for row, entry in budget["rows"].items():
        runs, mean = entry["runs"], entry["mean"]
        caps = sorted({r["max_epochs"] for r in runs if r["max_epochs"] is not None})
        n_bad = entry["not_converged"]
        flag = f"{len(runs) - n_bad} of {len(runs)}" + (f" ({n_bad} {NOT_CONVERGED})" if n_bad else "")
        out.append(
            f"| {row} | {len(runs)} | {_num(mean['epochs_run'], 1)} ({', '.join(map(str, caps)) or '—'}) | "
            f"{_num(mean['best_epoch'], 1)} | {flag} | {cost(mean)} |"
        )
    out += [
        "",
        "## Per run",
        "",
        "| row | seed | epochs run | cap | best epoch | stopped | steps | CPU-s | wall s | params |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row, entry in budget["rows"].items():
        for r in entry["runs"]:
            stopped = r["stopped_by"] + ("" if r["converged"] else f": **{NOT_CONVERGED}**")
            out.append(
                f"| {row} | {r['seed']} | {r['epochs_run']} | {r['max_epochs']} | {r['best_epoch']} | {stopped} | "
                f"{_num(r['gradient_steps'])} | {_num(r['cpu_seconds'], 1)} | {_num(r['train_seconds'], 1)} | "
                f"{_num(r['n_parameters'])} |"
            )
    return "\n".join(out) + "\n"


def plot_curves(budget: dict[str, Any], folder: Path) -> list[Path]:
    """One figure per row: train loss and the selecting validation score per epoch, a line per seed, the kept epoch
    marked, the cap a dotted line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for row, entry in budget["rows"].items():
        fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.0))
        for r in entry["runs"]:
            curve, select = r["curve"], r["select"]
            for ax, key in zip(axes, ("train_loss", select), strict=True):
                (line,) = ax.plot(curve["epoch"], curve[key], lw=1, label=f"seed {r['seed']}")
                if r["best_epoch"] in curve["epoch"]:
                    at = curve["epoch"].index(r["best_epoch"])
                    ax.plot([r["best_epoch"]], [curve[key][at]], "o", ms=4, color=line.get_color())
                if r["max_epochs"]:
                    ax.axvline(r["max_epochs"], color="grey", ls=":", lw=0.8)
        select = entry["runs"][0]["select"] if entry["runs"] else "val score"
        for ax, label in zip(axes, ("train loss", f"{select.replace('_', ' ')} (o: best.pt)"), strict=True):
            ax.set_xlabel("epoch")
            ax.set_ylabel(label)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{row}: learning curves per seed (dotted: the epoch cap)", fontsize=9)
        fig.tight_layout()
        path = folder / f"{row}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write(out: Path, grid: offline.Grid) -> list[Path]:
    """OUT/budget.json, OUT/budget.md and OUT/curves/<row>.png from the grid's finished runs."""
    budget = collect(grid)
    paths = [out / "budget.json", out / "budget.md"]
    atomic_write(paths[0], (json.dumps(budget, indent=1) + "\n").encode())
    atomic_write(paths[1], markdown(budget).encode())
    return [*paths, *plot_curves(budget, out / "curves")]


# -- several splits ------------------------------------------------------------------------------------------------
SPLIT_METRICS = ("clean return", "clean laps", "test mse", "test nll", "ood held-out mean")


def split_share(by_split: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per row and metric, from each split's results.json rows: the mean per split, the pooled within-split SD (the
    initialisation's spread), the SD of the split means, and the split's share of the variance (between / (between +
    within)); None where there are too few values."""
    rows: dict[str, dict[str, Any]] = {}
    names = dict.fromkeys(r for results in by_split.values() for r in results["rows"])
    for row in names:
        for metric in SPLIT_METRICS:
            values = {
                s: [v for v in (results["rows"].get(row, {}).get(metric) or {}).get("values", []) if v is not None]
                for s, results in by_split.items()
            }
            values = {s: v for s, v in values.items() if v}
            if not values:
                continue
            means = {s: sum(v) / len(v) for s, v in values.items()}
            within = [_var(v) for v in values.values() if len(v) > 1]
            within_var = sum(within) / len(within) if within else None
            between_var = _var(list(means.values())) if len(means) > 1 else None
            share = None
            if within_var is not None and between_var is not None and between_var + within_var > 0:
                share = between_var / (between_var + within_var)
            rows.setdefault(row, {})[metric] = {
                "mean_per_split": {str(s): m for s, m in means.items()},
                "sd_within_split": None if within_var is None else math.sqrt(within_var),
                "sd_between_splits": None if between_var is None else math.sqrt(between_var),
                "split_share": share,
            }
    return {"splits": list(by_split), "rows": rows}


def _var(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def split_markdown(share: dict[str, Any], command: str) -> str:
    out = [
        "# The split's share of the spread",
        "",
        f"`{command}`",
        "",
        f"The grid on each split {share['splits']} (OUT/split<N>, each with its own results.md and budget.md). Per row "
        "and metric: the mean on each split, the SD over training seeds within a split (pooled: the initialisation's "
        "spread), the SD of the split means, and the split's share of the variance, between / (between + within).",
        "",
        "| row | metric | mean per split | SD within split | SD between splits | split's share |",
        "|---|---|---|---|---|---|",
    ]
    for row, metrics in share["rows"].items():
        for metric, e in metrics.items():
            means = ", ".join(f"{s}: {m:.4g}" for s, m in e["mean_per_split"].items())
            sd_w, sd_b, sh = e["sd_within_split"], e["sd_between_splits"], e["split_share"]
            out.append(
                f"| {row} | {metric} | {means} | {'—' if sd_w is None else f'{sd_w:.3g}'} | "
                f"{'—' if sd_b is None else f'{sd_b:.3g}'} | {'—' if sh is None else f'{sh:.0%}'} |"
            )
    return "\n".join(out) + "\n"


def write_splits(out: Path, by_split: dict[int, dict[str, Any]], command: str) -> list[Path]:
    share = split_share(by_split)
    paths = [out / "splits.json", out / "splits.md"]
    atomic_write(paths[0], (json.dumps({**share, "command": command}, indent=1) + "\n").encode())
    atomic_write(paths[1], split_markdown(share, command).encode())
    return paths
