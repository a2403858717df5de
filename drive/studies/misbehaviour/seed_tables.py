"""The misbehaviour benchmark's tables over training seeds (drive/studies/misbehaviour/seeds.py `over_seeds`): one
summary row per controller (the README's results table), the prediction and prevention figures per monitor, and
Welch's p between every pair of controllers; `*` where a comparison survives Holm over its table."""

from __future__ import annotations

from typing import Any

from drive.studies.misbehaviour.seeds import figure_at
from drive.studies.misbehaviour.text import headline_mode, labels, modes
from drive.studies.over_seeds import cell_text, holm_marks, holm_note


def seeds_table(results: dict[str, Any]) -> list[str]:
    """Prediction (held-out families, the plan's level and TTM) and prevention as mean [95 % bootstrap interval] over
    the training seeds of each controller trained on several (drive/studies/misbehaviour/seeds.py `over_seeds`), `*`
    where Welch's p against the first controller survives Holm over the table's comparisons, counted in its note."""
    groups = results.get("over_seeds", {})
    if not groups:
        return []
    name = labels(list(groups))
    lines = [
        "| controller | seeds | misbehaviours per seed | monitor | recall | FPR | F3 | AUROC |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for group, entry in groups.items():
        counts = ", ".join(str(n) for n in entry["misbehaviours"])
        for monitor, by in entry["monitors"].items():
            figures = " | ".join(cell_text(by.get(k)) for k in ("recall", "fpr", "f3", "auroc"))
            lines.append(f"| {name[group]} | {len(entry['checkpoints'])} | {counts} | {monitor} | {figures} |")
        if not entry["monitors"]:
            lines.append(
                f"| {name[group]} | {len(entry['checkpoints'])} | {counts} | none scored (no nominal run "
                "without a misbehaviour, or no misbehaviour) | – | – | – | – |"
            )
    lines += ["", _holm_note([(g, m, k, s) for g, e in groups.items() for m, by in e["monitors"].items()
                              for k, s in by.items()], name, groups)]  # fmt: skip
    prevention = {g: e["prevention"] for g, e in groups.items() if e["prevention"]}
    keys = ("prevented", "episodes_prevented", "return_gain", "handed_over_benign", "handed_over_nominal",
            "interventions_per_km_nominal")  # fmt: skip
    header = [
        "| controller | fallback | prevented (held-out, pooled) | misbehaving episodes prevented | return gained "
        "(held-out mean) | steps handed over, benign shifted episodes | steps handed over, nominal | interventions "
        "/ km, nominal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    if prevention:
        mode = headline_mode(results)
        lines += ["", *header]
        for group, by in prevention.items():
            lines.append(f"| {name[group]} | {mode} | " + " | ".join(cell_text(by.get(k)) for k in keys) + " |")
        lines += ["", _holm_note([(g, "", k, s) for g, by in prevention.items() for k, s in by.items()], name, groups)]
    bounds = [(g, m, by) for g, e in groups.items() for m, by in e.get("prevention_bounds", {}).items()]
    if bounds:
        lines += ["", "The other fallback modes (bounds, untested: expert drives from privileged state):", "", *header]
        for group, mode, by in bounds:
            lines.append(f"| {name[group]} | {mode} | " + " | ".join(cell_text(by.get(k)) for k in keys) + " |")
    return lines + pairwise(groups, name)


def summary_table(results: dict[str, Any]) -> list[str]:
    """One row per controller over its training seeds (`over_seeds`): the declared monitor's F3 and AUROC beside its
    two nulls and the field's rules, its out-of-sample FPR, the scored windows per family, the misbehaving episodes
    each fallback mode prevents and the gate's nominal hand-overs per km, and the compute; mean [95 % interval]
    over seeds, `*` as in the seeds table (Holm over its comparisons with the first controller). [] without seeds."""
    groups = results.get("over_seeds", {})
    if not groups:
        return []
    plan = results["plan"]
    declared = plan.get("gate_signal", "epistemic_sum")
    asked = modes(plan).split(", ")
    name = labels(list(groups))
    oracle = [m for m in asked[1:] if m != "off"]
    lines = [
        "| controller | seeds | return, nominal runs | return, shifted runs | scored windows per family | "
        f"F3 ({declared}) | F3 nulls: permuted / free | F3, field's rules | AUROC | AUROC, permuted null | FPR | "
        f"episodes prevented, {asked[0]} | "
        + "".join(f"episodes prevented, {m} (oracle) | " for m in oracle)
        + f"hand-overs / km, nominal ({asked[0]}) | CPU ms per car-step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(oracle) + "---|---|",
    ]
    for group, entry in groups.items():
        by = entry["monitors"].get(declared, {})
        nulls = entry.get("nulls", {}).get(declared, {})
        windows = ", ".join(f"{f} {n}" for f, n in sorted(entry.get("windows", {}).items())) or "–"
        permuted, free = nulls.get("block_permuted", {}), nulls.get("information_free", {})
        cells = [
            name[group],
            str(len(entry["checkpoints"])),
            cell_text(entry.get("nominal_return")),
            cell_text(entry.get("shifted_return")),
            windows,
            cell_text(by.get("f3")),
            f"{cell_text(permuted.get('f3'))} / {cell_text(free.get('f3'))}",
            cell_text(entry.get("field", {}).get(declared, {}).get("f3")),
            cell_text(by.get("auroc")),
            cell_text(permuted.get("auroc")),
            cell_text(by.get("fpr")),
            cell_text(entry["prevention"].get("episodes_prevented")),
            *(cell_text(entry.get("prevention_bounds", {}).get(m, {}).get("episodes_prevented")) for m in oracle),
            cell_text(entry["prevention"].get("interventions_per_km_nominal")),
            cell_text(entry.get("ms_per_step")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _holm_note(stats: list[tuple[str, str, str, dict[str, Any]]], name: dict[str, str], groups: dict) -> str:
    """The note under a seeds table: the comparisons with the first group that `over_seeds` Holm-corrected, and
    which of them survive (their cells carry the `*`)."""
    tested = [(g, m, k) for g, m, k, stat in stats if stat.get("p") is not None]
    survivors = [" ".join(w for w in (name[g], m, k) if w) for g, m, k, s in stats if s.get("significant")]
    return holm_note(len(tested), survivors, f"comparisons with {name[next(iter(groups))]}")


def pairwise(groups: dict[str, Any], name: dict[str, str]) -> list[str]:
    """Welch's p of every pair of controllers on the summed epistemic variance's F3 and on the share prevented; `*`
    where it survives Holm over the table's pairs (each pair once, though the table shows it twice)."""
    lines: list[str] = []
    for title, where in (
        ("F3 of the summed epistemic variance", ("monitors", "epistemic_sum", "f3")),
        ("share of misbehaviours prevented", ("prevention", "prevented")),
    ):
        stats = {g: v for g, e in groups.items() if (v := figure_at(e, where))}
        if len(stats) < 2:
            continue
        lines += [
            "",
            f"Welch's p, {title} (row against column; `–`: no test, a side constant or under 2 seeds):",
            "",
            "| | " + " | ".join(name[g] for g in stats) + " |",
            "|---|" + "---|" * len(stats),
        ]
        pairs = [(g, h) for i, g in enumerate(stats) for h in list(stats)[i + 1 :]]
        adjusted, marks = holm_marks([stats[g].get("p_vs", {}).get(h) for g, h in pairs])
        survives = {frozenset(pair): mark for pair, mark in zip(pairs, marks, strict=True)}
        for g, v in stats.items():
            cells = ["" if h == g else _p(v.get("p_vs", {}).get(h), survives[frozenset((g, h))]) for h in stats]
            lines.append(f"| {name[g]} | " + " | ".join(cells) + " |")
        kept = [f"{name[g]} – {name[h]}" for (g, h), mark in zip(pairs, marks, strict=True) if mark]
        lines += ["", holm_note(sum(q is not None for q in adjusted), kept, "pairs")]
    return lines


def _p(p: float | None, survives: bool) -> str:
    return "–" if p is None else f"{p:.3f}" + (" *" if survives else "")
