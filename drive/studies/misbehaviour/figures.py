"""The misbehaviour benchmark's figures and its files on disk: F3 against the time to misbehaviour (f3.png), the
figures over training seeds (seeds.png), and `write_report` (results.json, results.md from text.py, the figures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from datasets.files import atomic_write
from datasets.root import portable
from drive.studies.misbehaviour.rows import pick, rows_of
from drive.studies.misbehaviour.text import labels, markdown


def plot_f3(results: dict[str, Any], path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan = results["plan"]
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn, name = False, labels(list(results["controllers"]))
    for controller, entry in results["controllers"].items():
        table = entry.get("prediction", {}).get("groups", {}).get("held_out")
        for monitor, rows in (table or {}).get("monitors", {}).items():
            typed = rows_of(rows)
            f3 = [pick(typed, plan["level"], t).value.f3 for t in plan["ttms"]]
            ax.plot(plan["ttms"], f3, marker="o", label=f"{name[controller]}: {monitor}")
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set(
        xlabel="time to misbehaviour (s)", ylabel="F3", title=f"held-out families, level {plan['level']}", ylim=(0, 1)
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


SEED_MONITORS = ("epistemic_steer", "epistemic_sum", "thirdeye_avg_grad", "selforacle")


def plot_seeds(results: dict[str, Any], path: Path) -> Path | None:
    """Controllers trained on several seeds: F3 per monitor (held-out, the plan's level and TTM) and the share the
    gate prevents, each seed a dot, the mean and its 95 % bootstrap interval a bar."""
    groups = results.get("over_seeds", {})
    if not groups:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan, name = results["plan"], labels(list(groups))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1.4]})
    width = 0.8 / len(SEED_MONITORS)
    for m, monitor in enumerate(SEED_MONITORS):
        for g, entry in enumerate(groups.values()):
            _seed_bar(
                left,
                g + (m - (len(SEED_MONITORS) - 1) / 2) * width,
                entry["monitors"].get(monitor, {}).get("f3"),
                f"C{m}",
                monitor if g == 0 else None,
            )
    for g, entry in enumerate(groups.values()):
        _seed_bar(right, g, entry["prevention"].get("prevented"), "C4", None)
    ticks = [name[g].replace("/seed*/best.pt", "") for g in groups]
    left.set(
        ylabel=f"F3 (held-out, TTM {plan['ttm']} s, level {plan['level']})",
        ylim=(-0.02, 1.02),
        xticks=range(len(groups)),
        xticklabels=ticks,
    )
    right.set(
        ylabel="share of misbehaviours prevented", ylim=(-0.02, 1.02), xticks=range(len(groups)), xticklabels=ticks
    )
    left.legend(fontsize=7, loc="upper left")
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle("over training seeds: each dot a seed, bars the mean and its 95 % bootstrap interval", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _seed_bar(ax: Any, x: float, stat: dict[str, Any] | None, colour: str, label: str | None) -> None:
    if not stat or stat["mean"] is None:
        return
    ax.scatter([x] * len(stat["values"]), stat["values"], s=10, color=colour, alpha=0.6, label=label)
    low, high = stat.get("low"), stat.get("high")
    err = [[stat["mean"] - low], [high - stat["mean"]]] if low is not None and high is not None else [[0.0], [0.0]]
    ax.errorbar([x], [stat["mean"]], yerr=err, fmt="_", color=colour, markersize=10, capsize=2)


def write_report(out: Path, results: dict[str, Any]) -> list[Path]:
    results = portable(results)
    atomic_write(out / "results.json", (json.dumps(results, indent=1, default=float) + "\n").encode())
    atomic_write(out / "results.md", markdown(results).encode())
    figures = [plot_seeds(results, out / "seeds.png") or plot_f3(results, out / "f3.png")]
    return [out / "results.json", out / "results.md", *(f for f in figures if f)]
