"""The misbehaviour benchmark's text: the tables of results.md (intervals, the nulls beside each monitor, the field's
published figures beside ours, labelled) and the headline the command prints. The figures and the files on disk
(results.json without machine paths, results.md, seeds.png or f3.png): figures.py."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from drive.studies.misbehaviour.report import fallbacks
from drive.studies.misbehaviour.rows import Row, pick, rows_of
from drive.studies.misbehaviour.seeds import figure_at
from drive.studies.over_seeds import cell_text, holm_marks, holm_note


def _ci(v: dict[str, float], fmt: str = ".2f") -> str:
    """'value [low, high]' of an interval {"value", "low", "high"}; '–' where the value is missing."""
    return _interval_text(v["value"], v["low"], v["high"], fmt)


def _row_ci(row: Row, figure: str, fmt: str = ".2f") -> str:
    """'value [low, high]' of one figure of a result row."""
    return _interval_text(getattr(row.value, figure), getattr(row.low, figure), getattr(row.high, figure), fmt)


def _interval_text(value: float | None, low: float, high: float, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    interval = "" if math.isnan(low) or math.isnan(high) else f" [{low:{fmt}}, {high:{fmt}}]"
    return f"{value:{fmt}}{interval}"


GENERIC = re.compile(r"(best|last)\.pt|seed(\d+|\*)")  # names that say nothing about which controller it is


def labels(controllers: Sequence[str]) -> dict[str, str]:
    """{path: the shortest trailing part of it that tells the controllers apart and is more than a generic name}:
    runs/b/gmle/seed0/best.pt -> gmle/seed0/best.pt, checkpoints/carracing_nsac.pt -> carracing_nsac.pt."""
    parts = {c: Path(c).parts for c in controllers}
    n = {c: 1 for c in controllers}
    while True:
        out = {c: "/".join(p[-n[c] :]) for c, p in parts.items()}
        grow = [
            c
            for c in controllers
            if n[c] < len(parts[c]) and (GENERIC.fullmatch(parts[c][-n[c]]) or list(out.values()).count(out[c]) > 1)
        ]
        if not grow:
            return out
        for c in grow:
            n[c] += 1


def prediction_table(results: dict[str, Any], group: str) -> list[str]:
    """The group's table at the plan's level and TTM: per controller and monitor the misbehaviours and, in brackets,
    the windows scored at that TTM (the rest start too early or overlap an earlier misbehaviour; counted, not
    weighted: the figures weight each family equally, `pooling_note`); the null controls
    beside each monitor; where the run kept the field's rules' figures beside ours (drive/studies/
    misbehaviour_report.py `prediction`), their F3 and AUROC in two more columns."""
    plan = results["plan"]
    tables = [e.get("prediction", {}).get("groups", {}).get(group) or {} for e in results["controllers"].values()]
    beside = any(t.get("field") for t in tables)
    controls = any(t.get("nulls") for t in tables)
    lines = [
        "| controller | monitor | misbehaviours (scored windows) | recall | FPR | F3 | AUROC | median lead (s) |"
        + (
            " F3 / AUROC, block-permuted null | F3 / AUROC, information-free null | clears its nulls |"
            if controls
            else ""
        )
        + (" F3, field's rules | AUROC, field's rules |" if beside else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|---|---|" if controls else "") + ("---|---|" if beside else ""),
    ]
    empty = (" – | – | – |" if controls else "") + (" – | – |" if beside else "")
    name = labels(list(results["controllers"]))
    for controller, entry in results["controllers"].items():
        pred = entry.get("prediction", {})
        table = pred.get("groups", {}).get(group)
        if not table:
            continue
        if table["misbehaviours"] and not table.get("monitors"):  # nothing nominal to fit a threshold on
            bad, n = pred.get("nominal_misbehaving"), pred.get("nominal_episodes")
            why = (
                f"every nominal run misbehaved ({bad})"
                if not n or bad == n
                else f"too few nominal windows ({bad} of {n} nominal runs misbehave)"
            )
            lines.append(f"| {name[controller]} | none: {why} | {table['misbehaviours']} | – | – | – | – | – |{empty}")
        for monitor, rows in table["monitors"].items():
            row = pick(rows_of(rows), plan["level"], plan["ttm"])
            field = table.get("field", {}).get(monitor)
            theirs = _null_cells(table.get("nulls", {}).get(monitor)) if controls else ""
            if beside:
                f = Row.from_dict(field) if field else None
                theirs += f" {_row_ci(f, 'f3')} | {_row_ci(f, 'auroc')} |" if f else " – | – |"
            shown = f"**{monitor}** (declared)" if monitor == plan.get("gate_signal") else monitor
            scored = _scored(table, plan["ttm"], row)  # the windows scored at this TTM
            lines.append(
                f"| {name[controller]} | {shown} | {table['misbehaviours']} ({scored}) | "
                f"{_row_ci(row, 'recall')} | {_row_ci(row, 'fpr', '.3f')} | {_row_ci(row, 'f3')} | "
                f"{_row_ci(row, 'auroc')} | {_row_ci(row, 'median_lead_s', '.1f')} |{theirs}"
            )
    return lines if len(lines) > 2 else ["No misbehaviour in these families for any controller: nothing to predict."]


def _scored(table: dict[str, Any], ttm: int, row: Row) -> int:
    """The windows a group's table scored at `ttm`: summed over its families; TP + FN in results written before
    the families were counted (they pooled episodes, every window weighing 1)."""
    families = table.get("families")
    if families:
        return sum(int(f["scored_windows"][str(ttm)]) for f in families.values())
    return round(row.value.tp + row.value.fn)


def pooling_note(results: dict[str, Any], group: str) -> str:
    """One sentence on how the group's figures pool its families, from its tables' "weighting"."""
    tables = [e.get("prediction", {}).get("groups", {}).get(group) or {} for e in results["controllers"].values()]
    said = {t.get("weighting") for t in tables if t}
    if "families equal" in said:
        beside = " The field's rules' columns pool episodes." if any(t.get("field") for t in tables) else ""
        return (
            "Pooled over families, each family weighted equally: a family's misbehaving episodes share one "
            "family's weight, so a family with more of them counts no more (TP, FN, AUROC, AUPRC and lead times "
            "weighted; false positives count every nominal window once); the bootstrap resamples within each "
            "family." + beside
        )
    if "episodes pooled" in said:
        return "Pooled over episodes (the field's rules): a family with more misbehaving episodes weighs more."
    if said:
        return "Pooled over episodes (scored before the families were weighted equally)."
    return ""


def family_table(results: dict[str, Any]) -> list[str]:
    """Per controller and family of the pooled groups (held_out, surrogate): the misbehaving episodes, each one's
    weight in its group and the windows scored at each TTM; [] where the results hold no such counts."""
    ttms = results["plan"]["ttms"]
    name = labels(list(results["controllers"]))
    rows = [
        f"| {name[controller]} | {group} | {family} | {f['misbehaving_episodes']} | {f['weight']:.3g} | "
        + " | ".join(str(f["scored_windows"].get(str(t), "–")) for t in ttms)
        + " |"
        for controller, entry in results["controllers"].items()
        for group in ("held_out", "surrogate")
        for family, f in (
            (entry.get("prediction", {}).get("groups", {}).get(group) or {}).get("families") or {}
        ).items()
    ]
    if not rows:
        return []
    return [
        "Scored windows per family and controller (the pooled figures weight each family equally: weight = each "
        "misbehaving episode's weight in its group):",
        "",
        "| controller | group | family | misbehaving episodes | weight | "
        + " | ".join(f"scored windows, TTM {t} s" for t in ttms)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(ttms),
        *rows,
    ]


def _null_cells(controls: dict[str, Any] | None) -> str:
    """Three cells: each null's F3 / AUROC and whether the monitor's F3 and AUROC intervals clear both nulls'."""
    if not controls:
        return " – | – | – |"
    nulls = {name: Row.from_dict(controls[name]) for name in ("block_permuted", "information_free")}
    cells = [f" {_row_ci(row, 'f3')} / {_row_ci(row, 'auroc')} |" for row in nulls.values()]
    clears = controls["clears"]
    verdict = {(True, True): "F3 and AUROC", (True, False): "F3 only", (False, True): "AUROC only"}
    return "".join(cells) + f" {verdict.get((clears['f3'], clears['auroc']), '**no**')} |"


def prevention_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "| controller | fallback | condition | misbehaviours without → with (safe stops) | prevented | episodes "
        "prevented (early, apart) | return without | return with | interventions / km | steps handed over "
        "(benign episodes) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    name = labels(list(results["controllers"]))
    for controller, entry in results["controllers"].items():
        if entry.get("fallback_skipped"):
            lines.append(f"| {name[controller]} | – | – | {entry['fallback_skipped']} |" + " – |" * 6)
        for mode, fb in fallbacks(entry).items():
            for condition, p in fb["conditions"].items():
                episodes = (
                    f"{_ci(p['episodes_prevented'])} of {p['misbehaving_episodes']} ({p['early_episodes']})"
                    if "episodes_prevented" in p
                    else "–"
                )
                lines.append(
                    f"| {name[controller]} | {mode} | {condition} | {p['misbehaviours_without']} → "
                    f"{p['misbehaviours_with']} ({p.get('safe_stops', 0)}) | {_ci(p['prevented'])} | {episodes} | "
                    f"{_ci(p['return_without'], fmt='.0f')} | {_ci(p['return_with'], fmt='.0f')} | "
                    f"{_ci(p['interventions_per_km'])} | {_ci(p['handed_over_benign'], fmt='.3f')} "
                    f"({p['benign_episodes']}) |"
                )
    return lines


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
        mode = _headline_mode(results)
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
    modes = _modes(plan).split(", ")
    name = labels(list(groups))
    oracle = [m for m in modes[1:] if m != "off"]
    lines = [
        f"| controller | seeds | return, nominal runs | scored windows per family | F3 ({declared}) | F3 nulls: "
        "permuted / free | F3, field's "
        f"rules | AUROC | AUROC, permuted null | FPR | episodes prevented, {modes[0]} | "
        + "".join(f"episodes prevented, {m} (oracle) | " for m in oracle)
        + f"hand-overs / km, nominal ({modes[0]}) | CPU ms per car-step |",
        "|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(oracle) + "---|---|",
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


def _modes(plan: dict[str, Any]) -> str:
    """The run's fallback modes as written, the headline first (a single string in results written before)."""
    modes = plan.get("fallback") or ()
    return modes if isinstance(modes, str) else ", ".join(modes) or "off"


def _headline_mode(results: dict[str, Any]) -> str:
    return _modes(results["plan"]).split(", ")[0]


def _p(p: float | None, survives: bool) -> str:
    return "–" if p is None else f"{p:.3f}" + (" *" if survives else "")


def headline(results: dict[str, Any]) -> str:
    plan = results["plan"]
    head = (
        f"held-out shift families, TTM {plan['ttm']} s, confidence level {plan['level']} "
        "(value [95 % bootstrap interval over episodes]):"
    )
    note = pooling_note(results, "held_out")
    families = family_table(results)
    return "\n".join(
        [
            head,
            *prediction_table(results, "held_out"),
            *(["", note] if note else []),
            *(["", *families] if families else []),
        ]
    )


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
        f"The fallback ({_modes(plan)}) engages when the declared monitor "
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
