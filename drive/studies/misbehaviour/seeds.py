"""The misbehaviour benchmark's statistics over training seeds, from the per-checkpoint figures of report.py.

Over training seeds (`over_seeds`): checkpoints whose paths differ only in a `seed<N>` part are one controller trained
on several seeds. Per such group and monitor, the headline figures (held-out families, the plan's level and TTM) and
the prevention figures (held-out conditions pooled) of each seed become a mean with a 95 % percentile bootstrap
interval over the seeds, inside the metric's range (drive/studies/over_seeds.py). Welch's test compares every pair of
groups (`p_vs`); the comparisons with the first group are Holm-corrected as two families, the ones its tables show
(every monitor's recall, FPR, F3 and AUROC of every other group; every prevention figure of every other group), and
only those whose corrected p (`p_holm`) stays below 0.05 are marked significant. The bootstrap intervals above are
over episodes of one trained model; these are over the training seeds, the variation a user retraining the
controller meets.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from drive.studies.misbehaviour.report import NOMINAL, fallbacks
from drive.studies.misbehaviour.rows import Row, pick, rows_of
from drive.studies.over_seeds import ALPHA, bounds_of, holm_marks, interval, welch

SEED_PART = re.compile(r"(?<![^/])seed\d+(?![^/])")  # a whole path part: runs/de/seed2/best.pt
PREDICTION_METRICS = ("recall", "fpr", "f3", "auroc")


def seed_groups(controllers: Sequence[str]) -> dict[str, list[str]]:
    """{the path with its seed part as `seed*`: the checkpoints} for the paths that differ only in that part."""
    out: dict[str, list[str]] = {}
    for c in controllers:
        out.setdefault(SEED_PART.sub("seed*", c), []).append(c)
    return {k: v for k, v in out.items() if len(v) > 1}


def _pooled_prevention(fallback: Mapping[str, Any], conditions: Sequence[str]) -> dict[str, float]:
    rows = [fallback["conditions"][c] for c in conditions if c in fallback["conditions"]]
    before, after = sum(r["misbehaviours_without"] for r in rows), sum(r["misbehaviours_with"] for r in rows)
    benign = sum(r["benign_episodes"] for r in rows)
    handed = sum(r["handed_over_benign"]["value"] * r["benign_episodes"] for r in rows if r["benign_episodes"])
    nominal = fallback["conditions"].get(NOMINAL, {})
    gains = [r["return_with"]["value"] - r["return_without"]["value"] for r in rows]
    out = {
        "prevented": 1 - after / before if before else math.nan,
        "return_gain": float(np.mean(gains)) if gains else math.nan,
        "handed_over_benign": handed / benign if benign else math.nan,
        "handed_over_nominal": nominal.get("handed_over_benign", {}).get("value", math.nan),
        "interventions_per_km_nominal": nominal.get("interventions_per_km", {}).get("value", math.nan),
    }
    if rows and all("episodes_prevented" in r for r in rows):  # results written before it was counted lack it
        episodes = sum(r["misbehaving_episodes"] for r in rows)
        saved = sum(
            r["episodes_prevented"]["value"] * r["misbehaving_episodes"] for r in rows if r["misbehaving_episodes"]
        )
        out["episodes_prevented"] = saved / episodes if episodes else math.nan
    return out


def over_seeds(results: Mapping[str, Any]) -> dict[str, Any]:
    """{group: {"checkpoints", "misbehaviours" (per seed), "monitors": {monitor: {metric: interval}}, "prevention":
    {metric: interval} (the headline fallback mode), "prevention_bounds": {mode: {metric: interval}} (the other
    modes, where the run had several; no tests: they are bounds), and where the run has them (none is tested): "nulls":
    {monitor: {null: {"f3", "auroc": interval}}} (the null controls), "field": {monitor: {"f3", "auroc": interval}}
    (the field's rules on the same episodes), "windows": {family: scored windows at the TTM, summed over seeds},
    "ms_per_step": interval (the ungated cells' CPU milliseconds per car-step: simulator, rendering, controller and
    monitors, on this machine), "nominal_return": interval (the nominal runs' mean return), "shifted_return":
    interval (the held-out conditions' mean return, each condition weighted equally)}} for every group of
    `seed_groups` (see the module docstring)."""
    plan, entries = results["plan"], results["controllers"]
    out: dict[str, Any] = {}
    for group, every in seed_groups(list(entries)).items():
        members = [c for c in every if "prediction" in entries[c]]  # cells not run yet (--report-only) count not
        if not members:
            continue
        values: dict[str, dict[str, list[float]]] = {}
        prevention: dict[str, list[float]] = {}  # the headline fallback mode's
        bounds: dict[str, dict[str, list[float]]] = {}  # the other modes' (expert: an oracle bound), not tested
        null_values: dict[str, dict[str, dict[str, list[float]]]] = {}  # {monitor: {null: {metric: per seed}}}
        field_values: dict[str, dict[str, list[float]]] = {}  # {monitor: {metric: per seed}}
        windows: dict[str, int] = {}
        cost: list[float] = []
        returns: list[float] = []  # the nominal runs' mean return per seed (runs that count their cells' steps)
        shifted: list[float] = []  # the held-out ramps' mean return per seed, each family weighted equally
        misbehaviours = []
        for c in members:
            table = entries[c].get("prediction", {}).get("groups", {}).get("held_out", {})
            misbehaviours.append(table.get("misbehaviours", 0))
            for family, counts in table.get("families", {}).items():
                windows[family] = windows.get(family, 0) + counts["scored_windows"].get(str(plan["ttm"]), 0)
            for monitor, controls in table.get("nulls", {}).items():
                for null in ("block_permuted", "information_free"):
                    value = Row.from_dict(controls[null]).value
                    for metric in ("f3", "auroc"):
                        at = null_values.setdefault(monitor, {}).setdefault(null, {})
                        at.setdefault(metric, []).append(getattr(value, metric))
            for monitor, row in table.get("field", {}).items():
                value = Row.from_dict(row).value
                for metric in ("f3", "auroc"):
                    field_values.setdefault(monitor, {}).setdefault(metric, []).append(getattr(value, metric))
            cells = entries[c].get("episodes", {}).values()
            if cells and all(cell.get("steps") and math.isfinite(cell.get("cpu_s", math.nan)) for cell in cells):
                cost.append(1000 * sum(cell["cpu_s"] for cell in cells) / sum(cell["steps"] for cell in cells))
                returns.append(entries[c]["episodes"].get(NOMINAL, {}).get("mean_return", math.nan))
                held_out = [entries[c]["episodes"].get(k, {}).get("mean_return") for k in table.get("conditions", [])]
                shifted.append(float(np.mean(held_out)) if held_out and None not in held_out else math.nan)
            for monitor, rows in table.get("monitors", {}).items():
                value = pick(rows_of(rows), plan["level"], plan["ttm"]).value
                for metric in PREDICTION_METRICS:
                    values.setdefault(monitor, {}).setdefault(metric, []).append(getattr(value, metric))
            for i, (mode, block) in enumerate(fallbacks(entries[c]).items()):
                pooled = _pooled_prevention(block, table.get("conditions", []))
                for metric, v in pooled.items():
                    (prevention if i == 0 else bounds.setdefault(mode, {})).setdefault(metric, []).append(v)
        out[group] = {
            "checkpoints": members,
            "not_run": [c for c in every if c not in members],
            "misbehaviours": misbehaviours,
            "monitors": {m: {k: interval(v, bounds_of(k)) for k, v in by.items()} for m, by in values.items()},
            "prevention": {k: interval(v, bounds_of(k)) for k, v in prevention.items()},
        }
        if bounds:
            out[group]["prevention_bounds"] = {
                mode: {k: interval(v, bounds_of(k)) for k, v in by.items()} for mode, by in bounds.items()
            }
        if null_values:
            out[group]["nulls"] = {
                m: {null: {k: interval(v, bounds_of(k)) for k, v in by.items()} for null, by in nulls.items()}
                for m, nulls in null_values.items()
            }
        if field_values:
            out[group]["field"] = {
                m: {k: interval(v, bounds_of(k)) for k, v in by.items()} for m, by in field_values.items()
            }
        if windows:
            out[group]["windows"] = windows
        if len(cost) == len(members):
            out[group]["ms_per_step"] = interval(cost, (0.0, math.inf))
            out[group]["nominal_return"] = interval(returns)
            out[group]["shifted_return"] = interval(shifted)
    _compare(out)
    return out


def _compare(out: dict[str, Any]) -> None:
    """Welch's p of every figure against every other group's (`p_vs`), and Holm over the comparisons with the first
    group, the reference its tables mark (`p`, `p_holm`, `significant`), in place."""
    for name, entry in out.items():  # Welch's p against every other group; the first group is the marked reference
        figures = [(("monitors", m), by) for m, by in entry["monitors"].items()] + [
            (("prevention",), entry["prevention"])
        ]
        for where, by in figures:
            for metric, stat in by.items():
                others = {g: figure_at(e, where).get(metric) for g, e in out.items() if g != name}
                stat["p_vs"] = {g: welch(stat["values"], o["values"]) for g, o in others.items() if o}
    reference = next(iter(out), None)
    for family in ("monitors", "prevention"):  # the two tables' families of comparisons with the reference
        stats = [
            stat
            for name, entry in out.items()
            if name != reference
            for by in (entry["monitors"].values() if family == "monitors" else [entry["prevention"]])
            for stat in by.values()
        ]
        adjusted, marks = holm_marks([stat["p_vs"].get(reference) for stat in stats], ALPHA)
        for stat, q, mark in zip(stats, adjusted, marks, strict=True):
            stat.update(p=stat["p_vs"].get(reference), p_holm=q, significant=mark)


def figure_at(entry: Mapping[str, Any], where: tuple[str, ...]) -> dict[str, Any]:
    """entry[where[0]][where[1]]..., {} where a key is missing: a figure of an `over_seeds` group by its path."""
    for key in where:
        entry = entry.get(key, {})
    return dict(entry)
