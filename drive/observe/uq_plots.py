"""Figures of the uncertainty studies: OOD score distributions (`drive ood`), robustness curves (`drive bench
robustness`), failure prediction and the fallback (`drive eval`), and the gated-DAgger curve. Every panel has a
legend; variances are drawn on a log axis (epistemic variances span 1e-9 to 1e-1 across the six controllers).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from drive import metrics

FLOOR = 1e-12  # variances are drawn on a log axis; exact zeros (deterministic methods) sit on this floor


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ood_scores(
    scores: Mapping[str, Mapping[str, Mapping[str, np.ndarray]]],
    perturbations: Sequence[str],
    path: Path,
    key: str = "epistemic_all",
) -> Path:
    """Histograms of log10 score on clean vs perturbed inputs: one row per controller, one column per perturbation."""
    plt = _pyplot()
    rows, cols = len(scores), len(perturbations)
    fig, axes = plt.subplots(rows, cols, figsize=(2.9 * cols, 2.1 * rows), squeeze=False)
    for r, (name, views) in enumerate(scores.items()):
        clean = np.log10(np.maximum(views["clean"][key], FLOOR))
        for c, pert in enumerate(perturbations):
            ax = axes[r, c]
            other = np.log10(np.maximum(views[pert][key], FLOOR))
            lo, hi = float(min(clean.min(), other.min())), float(max(clean.max(), other.max()))
            auc = metrics.auroc(views["clean"][key], views[pert][key])
            ax.set_title(f"{name} | {pert}: AUROC {auc:.2f}", fontsize=8)
            if hi - lo < 1e-9:  # one value everywhere (GMLE's epistemic variance is 0): say so, draw no histogram
                value = float(views["clean"][key].flat[0])
                ax.text(
                    0.5,
                    0.5,
                    f"constant score {value:.3g}\n(no {key.split('_')[0]} term)",
                    ha="center",
                    va="center",
                    fontsize=7,
                    transform=ax.transAxes,
                )
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            bins = np.linspace(lo, hi + 1e-9, 40)
            ax.hist(clean, bins, alpha=0.55, color="tab:blue", label="clean")
            ax.hist(other, bins, alpha=0.55, color="tab:red", label=pert)
            ax.legend(fontsize=6, loc="upper left")
            ax.tick_params(labelsize=6)
            if r == rows - 1:
                ax.set_xlabel(f"log10 {key.replace('_', ' ')} var", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_robustness(table: Mapping[str, Sequence[Mapping[str, Any]]], path: Path) -> Path:
    """One row per perturbation kind, columns return / coverage90 steer / mean epistemic var (log), a line per
    controller against the perturbation's level (domain_randomize: off = 0, on = 1)."""
    plt = _pyplot()
    kinds = list(dict.fromkeys(row["kind"] for rows in table.values() for row in rows))
    cols = (
        ("mean_return", "mean return"),
        ("coverage90_steer", "coverage90 of the expert's steer"),
        ("epistemic_var_steer", "mean epistemic var (steer)"),
    )
    fig, axes = plt.subplots(len(kinds), 3, figsize=(12, 2.6 * len(kinds)), squeeze=False)
    for r, kind in enumerate(kinds):
        for c, (key, label) in enumerate(cols):
            ax = axes[r, c]
            for name, rows in table.items():
                pts = sorted((row["level"], row[key]) for row in rows if row["kind"] == kind and row[key] is not None)
                if pts:
                    x, y = np.array(pts, dtype=float).T
                    ax.plot(x, np.maximum(y, FLOOR) if c == 2 else y, marker="o", ms=3, label=name)
            if c == 2:
                ax.set_yscale("log")
            if c == 1:
                ax.axhspan(0.85, 0.95, color="green", alpha=0.08, label="target 0.85-0.95")
            ax.set_title(f"{kind}: {label}", fontsize=8)
            ax.set_xlabel("off / on" if kind == "domain_randomize" else "level", fontsize=7)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_eval(results: Mapping[str, Any], path: Path) -> Path | None:
    """`drive eval` of a controller, written to `path` (`eval_figure`). None when the results hold nothing to draw."""
    fig = eval_figure(results)
    if fig is None:
        return None
    fig.savefig(path, dpi=90)
    _pyplot().close(fig)
    return path


def _say_why_empty(ax: Any, why: str) -> None:
    """A panel with nothing to draw states why instead of showing an axis with no data (its title stays)."""
    ax.set_axis_off()
    ax.text(0.5, 0.5, textwrap.fill(why, 42), ha="center", va="center", fontsize=8, transform=ax.transAxes)


def eval_figure(results: Mapping[str, Any]) -> Any:
    """Failure prediction (AUROC and median lead per signal) and, with a fallback, every seed's return with and
    without it. A failure-prediction panel with no value to show (no events, none foreseen) says so in words.
    None when the results hold neither."""
    reports = {k: v for k, v in results.items() if k.startswith("failure_prediction")}
    has_fallback = "episodes_no_fallback" in results
    if not reports and not has_fallback:
        return None
    plt = _pyplot()
    n = (2 if reports else 0) + (1 if has_fallback else 0)
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n, 3.4), squeeze=False)
    col = 0
    if reports:
        width = 0.8 / len(reports)
        bars = {}
        for i, (name, rep) in enumerate(sorted(reports.items())):
            label = {
                "failure_prediction": "with fallback" if has_fallback else "controller",
                "failure_prediction_no_fallback": "without fallback",
            }.get(name, name)
            signals = list(rep["signals"])
            auc = [rep["signals"][s]["auroc"] or np.nan for s in signals]
            lead = [rep["signals"][s].get("median_lead_steps") or np.nan for s in signals]
            bars[label] = (np.arange(len(signals)) + i * width, auc, lead)
        horizon = rep["horizon"]
        n_events = sum(sum(r.get("events", {}).values()) for r in reports.values())
        no_events = "no failure event (off track, spin, stall) in these episodes"
        panels = (
            (
                axes[0, 0],
                1,
                f"AUROC: event within {horizon} steps",
                f"{no_events}: nothing to score"
                if not n_events
                else f"no AUROC: every scored step is within {horizon} steps of an event, or none is",
            ),
            (
                axes[0, 1],
                2,
                "median lead: threshold crossing -> event (steps)",
                f"{no_events}: no lead time to show"
                if not n_events
                else f"no event was foreseen: no signal crossed its threshold in the {horizon} steps before one",
            ),
        )
        for ax, k, title, why in panels:
            ax.set_title(title, fontsize=8)
            if all(np.isnan(values[k]).all() for values in bars.values()):
                _say_why_empty(ax, why)
                continue
            for label, values in bars.items():
                ax.bar(values[0], values[k], width, label=label)
            ticks = [s.replace("_", "\n") for s in signals]
            ax.set_xticks(np.arange(len(signals)) + 0.4 - width / 2, ticks, fontsize=7)
            ax.legend(fontsize=6)
            if k == 1:
                ax.axhline(0.5, color="0.5", ls=":", lw=1)
        col = 2
    if has_fallback:
        ax = axes[0, col]
        seeds = [r["seed"] for r in results["episodes"]]
        ax.plot(seeds, [r["return"] for r in results["episodes"]], "o-", ms=3, label="with fallback")
        ax.plot(seeds, [r["return"] for r in results["episodes_no_fallback"]], "s--", ms=3, label="without")
        for r in results["episodes"]:
            if r.get("n_interventions"):
                ax.annotate(str(r["n_interventions"]), (r["seed"], r["return"]), fontsize=6, color="red")
        ax.set_title("return per seed (red: interventions)", fontsize=8)
        ax.set_xlabel("track seed", fontsize=7)
        ax.xaxis.get_major_locator().set_params(integer=True)  # seeds are integers
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def plot_dagger_curve(points: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Closed-loop return against expert labels used, one line per arm (plain / gated DAgger)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for arm in dict.fromkeys(p["arm"] for p in points):
        pts = sorted((p["labels"], p["mean_return"], p.get("min_return", np.nan)) for p in points if p["arm"] == arm)
        x, y, lo = np.array(pts, dtype=float).T
        ax.plot(x, y, "o-", label=f"{arm}: mean return")
        ax.plot(x, lo, "v:", alpha=0.6, label=f"{arm}: worst episode")
    ax.set_xlabel("expert labels used (DAgger rounds)")
    ax.set_ylabel("closed-loop return")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
