"""The report of `drive bench controllers`: results.md (one table per stage, mean [95 % bootstrap interval] over
training seeds, * where Welch's test against the reference row survives Holm's correction over that table's
comparisons) and returns.png (closed-loop return per condition)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from datasets.files import atomic_write
from drive.studies.controllers.grid import CLEAN, LOOP_METRICS, OFFLINE_METRICS, SHIFT_METRICS
from drive.studies.over_seeds import cell_text, holm_marks, holm_note


def _table(results: dict[str, Any], metrics: list[tuple[str, str]]) -> list[str]:
    """The rows x `metrics` table, then its note: Welch's p against the reference row of every cell that has one
    (results.json's `p_vs_reference`, uncorrected) Holm-corrected as one family, `*` on the cells that survive."""
    tested = [
        (row, key, label)
        for row, values in results["rows"].items()
        for key, label in metrics
        if "p_vs_reference" in values.get(key, {})
    ]
    adjusted, marks = holm_marks([results["rows"][row][key]["p_vs_reference"] for row, key, _ in tested])
    starred = {(row, key): mark for (row, key, _), mark in zip(tested, marks, strict=True)}
    lines = ["| row | n | " + " | ".join(label for _, label in metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for row, values in results["rows"].items():
        n = max((values[key]["n"] for key, _ in metrics if key in values), default=0)
        cells = [
            cell_text(values[key] | {"significant": starred.get((row, key), False)} if key in values else None)
            for key, _ in metrics
        ]
        lines.append(f"| {row} | {n} | " + " | ".join(cells) + " |")
    survivors = [f"{row} {label}" for (row, _, label), mark in zip(tested, marks, strict=True) if mark]
    m = sum(q is not None for q in adjusted)
    return [*lines, "", holm_note(m, survivors, f"comparisons with `{results['reference']}`")]


def headline(results: dict[str, Any]) -> list[str]:
    """The README's table: return, laps and coverage clean; the share of it kept under each shift; OOD AUROC on the
    held-out families (mean) and on NSAC's surrogate families; the offline test NLL."""
    fam = results["ood"]
    metrics = [
        (f"{CLEAN} return", "return clean"),
        (f"{CLEAN} laps", "lap share"),
        (f"{CLEAN} coverage90_steer", "cov90 steer"),
    ]
    metrics += [(f"{shift} retained", f"return kept, {shift}") for shift in results["shifts"]]
    if fam["held_out"]:
        metrics.append(("ood held-out mean", "OOD AUROC, held-out families"))
    metrics += [(f"ood {f}", f"OOD AUROC, {f} (NSAC's surrogate)") for f in fam["surrogate"]]
    return _table(results, [*metrics, ("test nll", "test NLL"), ("test mse", "test MSE")])


def markdown(results: dict[str, Any], command: str) -> str:
    ref, fam = results["reference"], results["ood"]
    out = [
        "# Controllers at one budget: mean [95 % interval] over training seeds",
        "",
        f"`{command}`",
        "",
        f"Each figure: the mean over training seeds {results['seeds']} [a 95 % percentile bootstrap interval of "
        "that mean over the seeds, within the metric's range; n, the seeds, beside it: with 3 seeds it is narrow "
        f"and optimistic]. `*`: Welch's t-test against the reference row `{ref}`, Holm-corrected over the "
        f"comparisons of its table, gives p < {results['alpha']} (the uncorrected p-values are in results.json; "
        "each table's note counts its comparisons and names the survivors). No `*` means the difference is not "
        f"shown to be real at this number of seeds. Closed loop on the unseen tracks {results['eval_seeds']}.",
        "",
        "## Headline",
        "",
        *headline(results),
        "",
        "## Offline: the held-out test episodes of each seed's split",
        "",
        *_table(results, [(f"test {m}", m) for m in OFFLINE_METRICS] + [("train s", "train s")]),
        "",
        "## Closed loop, clean camera",
        "",
        *_table(results, [(f"{CLEAN} {m}", m) for m in LOOP_METRICS]),
    ]
    for shift in results["shifts"]:
        out += [
            "",
            f"## Closed loop under `{shift}`",
            "",
            "retained: return under the shift / clean return, per seed; epistemic_ratio: the mean steering "
            "epistemic variance under the shift / clean.",
            "",
            *_table(results, [(f"{shift} {m}", m) for m in SHIFT_METRICS]),
        ]
    if fam["held_out"] or fam["surrogate"]:
        out += [
            "",
            "## OOD detection: AUROC of the epistemic variance, perturbed frames against clean ones",
            "",
            f"Held-out families (no method trains on them): {', '.join(fam['held_out']) or 'none'}; NSAC's "
            f"training surrogate draws from {', '.join(fam['surrogate']) or 'none of those given'}, so its "
            "figures there are in-family and reported apart.",
            "",
            *_table(
                results,
                [("ood held-out mean", "held-out mean")]
                + [(f"ood {f}", f) for f in fam["held_out"]]
                + [(f"ood {f}", f"{f} (NSAC's surrogate)") for f in fam["surrogate"]],
            ),
        ]
    out += ["", "## Commands: one training run per row (seed 0; seeds 1, 2 change --seed and --out)", ""]
    out += [f"- {row}: `{cmd}`" for row, cmd in results["train_commands"].items()]
    return "\n".join(out) + "\n"


def plot_returns(results: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conditions = [CLEAN, *results["shifts"]]
    rows = list(results["rows"])
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(rows), 3.4))
    width = 0.8 / len(conditions)
    for j, cond in enumerate(conditions):
        entries = [results["rows"][r].get(f"{cond} return") for r in rows]
        means = [e["mean"] if e and e["mean"] is not None else 0.0 for e in entries]
        errs = [
            [m - e["low"] if e and e.get("low") is not None else 0.0 for e, m in zip(entries, means, strict=True)],
            [e["high"] - m if e and e.get("high") is not None else 0.0 for e, m in zip(entries, means, strict=True)],
        ]
        xs = [i + (j - (len(conditions) - 1) / 2) * width for i in range(len(rows))]
        ax.bar(xs, means, width, yerr=errs, capsize=2, label=cond, error_kw={"elinewidth": 0.8, "alpha": 0.6})
        for i, (x, e) in enumerate(zip(xs, entries, strict=True)):  # each seed's value: one bad seed shows as one
            seeds = (e or {}).get("values") or []
            ax.scatter([x] * len(seeds), seeds, s=9, color="black", zorder=3, label="seed" if i == j == 0 else None)
    ax.set_xticks(range(len(rows)), rows)
    ax.set_ylabel("closed-loop return\n(bar: mean, 95 % bootstrap CI; dots: seeds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out: Path, results: dict[str, Any], command: str) -> list[Path]:
    paths = [out / "results.json", out / "results.md"]
    atomic_write(paths[0], (json.dumps({**results, "command": command}, indent=1) + "\n").encode())
    atomic_write(paths[1], markdown(results, command).encode())
    return [*paths, plot_returns(results, out / "returns.png")]
