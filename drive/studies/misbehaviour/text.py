"""The misbehaviour benchmark's per-checkpoint text: the prediction, family and prevention tables of results.md
(intervals, the nulls beside each monitor, the field's published figures beside ours, labelled) and the headline the
command prints. The tables over training seeds: seed_tables.py; results.md and the figures on disk: figures.py."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from drive.studies.misbehaviour.report import fallbacks
from drive.studies.misbehaviour.rows import Row, pick, rows_of


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


# names that say nothing about which controller it is
GENERIC = re.compile(r"(best|last|sa_controller)\.pt|seed(\d+|\*)")


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


def modes(plan: dict[str, Any]) -> str:
    """The run's fallback modes as written, the headline first (a single string in results written before)."""
    modes = plan.get("fallback") or ()
    return modes if isinstance(modes, str) else ", ".join(modes) or "off"


def headline_mode(results: dict[str, Any]) -> str:
    return modes(results["plan"]).split(", ")[0]


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
