"""The misbehaviour benchmark's figures and its files on disk: F3 against the time to misbehaviour (f3.png), the
figures over training seeds (seeds.png), results.md (`markdown`, from the tables of text.py and seed_tables.py) and
`write_report` (results.json, results.md, the figures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from datasets.files import atomic_write
from datasets.root import portable
from drive.studies.misbehaviour.rows import pick, rows_of
from drive.studies.misbehaviour.seed_tables import seeds_table, summary_table
from drive.studies.misbehaviour.text import headline, labels, modes, pooling_note, prediction_table, prevention_table


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


def markdown(results: dict[str, Any]) -> str:
    plan = results["plan"]
    run = results.get("this_run", {})
    lines = [
        "# Misbehaviour prediction and prevention (`drive bench misbehaviour`)",
        "",
        f"Controllers: {', '.join(plan['controllers'])}; nominal seeds {len(plan['nominal_seeds'])}, "
        f"{len(plan['seeds'])} seeds per shifted condition; levels {plan['levels']}, TTM {plan['ttms']} s; "
        f"{plan['n_boot']} bootstrap replicates. Windows: {results['protocol']['windows']}.",
        "",
        "## Prediction on held-out families (the headline)",
        "",
        headline(results),
        "",
        *(
            [
                "## Summary over training seeds (held-out families, the declared monitor; mean [95 % bootstrap "
                "interval] over seeds)",
                "",
                *summary_table(results),
                "",
            ]
            if results.get("over_seeds")
            else []
        ),
        *(
            [
                "## Over training seeds (held-out families; mean [95 % bootstrap interval] over seeds, * Welch p "
                f"against {labels(list(results['over_seeds']))[next(iter(results['over_seeds']))]}, same monitor, "
                "below 0.05 after Holm over the table)",
                "",
                *seeds_table(results),
                "",
            ]
            if results.get("over_seeds")
            else []
        ),
        "## Prediction on NSAC's surrogate families (noise, brightness: trained on, reported apart)",
        "",
        *prediction_table(results, "surrogate"),
        "",
        *([pooling_note(results, "surrogate"), ""] if pooling_note(results, "surrogate") else []),
        "## Prevention and its false-alarm cost",
        "",
        f"The fallback ({modes(plan)}) engages when the declared monitor "
        f"({plan.get('gate_signal', 'epistemic_steer')}) reaches its threshold "
        + (
            f"for a false-alarm budget of {plan['gate_budget']:g} hand-overs per km (the gate replayed on the "
            "calibration seeds' nominal runs)"
            if plan.get("gate_budget")
            else f"at level {plan['level']}"
        )
        + ", fitted on every other nominal seed; the gated nominal runs drive the others (their interventions / km: "
        "the budget measured out of sample). slow uses nothing privileged (a stall "
        "while engaged is a safe stop, counted apart); expert hands over to the PPO expert, which drives from "
        "privileged state: an oracle bound. Episodes that misbehave before their first scorable window are counted "
        "apart (early).",
        "",
        *prevention_table(results),
        "",
        "## The field's published figures (Udacity simulator: another setting, beside ours)",
        "",
        *(f"- {who}: {what}" for who, what in results["published"]),
        "",
        f"Cost: this run {run.get('wall_s', 0) / 3600:.2f} h wall, {run.get('cpu_s', 0) / 3600:.2f} CPU-hours "
        f"(this process and its pool workers; Ray workers not counted); all cells "
        f"{results.get('cells_wall_s', 0) / 3600:.2f} h wall.",
        "",
    ]
    return "\n".join(lines)
