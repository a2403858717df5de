"""The SA study's summary over a benchmark's runs: the paper's Table-2 analogue, matched-coverage widths, costs, the
nu searches and each of the paper's claims marked reproduced or not (tasks sa-uci and sa-forecast, `summary`).

Input: one record per finished run, {"dataset", "row", "seed", "metrics"} (metrics = its metrics.json); a run's
method rows are metrics["study"]["methods"] (sa-forecast: several rows from one trained model) or the single
metrics["study"] (sa-uci: one controller, one row). Output (results.json "summary", rendered by the report):
{"tables": [{"title", "note", "columns", "rows"}], "claims": [{"id", "claim", "paper", "ours", "reproduced"}]}.
Matched coverage: per run, every baseline's split-conformal width-coverage curve (drive/learn/sa_study.py) read at
SA's native test coverage of its 95 % interval, divided by SA's native width; averaged over runs (seeds / splits).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np

from drive.learn.sa_study import width_at


def method_rows(metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    study = metrics.get("study", {})
    if "methods" in study:
        return dict(study["methods"])
    return {study["method"]: study} if "method" in study else {}


def collect(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[int, dict[str, Any]]]]:
    """{dataset: {method: {seed: study row (+ "fit")}}}."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for run in runs:
        for method, row in method_rows(run["metrics"]).items():
            out[run["dataset"]][method][run["seed"]] = {**row, "fit": run["metrics"].get("fit", {})}
    return out


def mean(values: list[float | None]) -> float | None:
    arr = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    return float(arr.mean()) if arr.size else None


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}" if abs(value) >= 1000 else f"{value:.{digits}f}"


def matched_ratios(
    rows: dict[str, dict[int, dict]], reference: str = "sa", conformal_reference: bool = False
) -> dict[str, float | None]:
    """Mean over shared seeds of width_m(at SA's native coverage) / SA's native width, per method.
    conformal_reference: divide by SA's own split-conformal width at that coverage instead, so that every method's
    interval is built the same way (mean +- q sigma) and only the spread's shape and size differ."""
    sa = rows.get(reference, {})
    out = {}
    for method, seeds in rows.items():
        ratios: list[float | None] = []
        for seed, row in seeds.items():
            if seed in sa and sa[seed]["native"]["width_95"] > 0:
                ref = sa[seed]["native"]
                width = width_at(sa[seed]["curve"], ref["coverage_95"]) if conformal_reference else ref["width_95"]
                ratios.append(width_at(row["curve"], ref["coverage_95"]) / width)
        out[method] = mean(ratios)
    return out


def stat(seeds: dict[int, dict], *path: str) -> float | None:
    values = []
    for row in seeds.values():
        v: Any = row
        for key in path:
            v = v.get(key) if isinstance(v, dict) else None
        values.append(v if isinstance(v, (int, float)) else None)
    return mean(values)


def method_table(data: dict, title: str, order: tuple[str, ...], paper: dict | None = None) -> dict[str, Any]:
    """datasets x methods: native nRMSE / MAE, PIT-W1, cov95, width95; matched ratio; after temperature scaling.
    paper: {dataset: {method: {native metric: value}}}, shown as [paper x] beside ours; its methods we did not run
    are rows of their own."""
    paper = paper or {}
    columns = [
        "dataset",
        "method",
        "runs",
        "nRMSE",
        "MAE",
        "PIT-W1",
        "cov95",
        "width95",
        "width @SA cov / SA",
        "/ SA conformal",
        "T",
        "PIT-W1 (TS)",
        "cov95 (TS)",
        "width95 (TS)",
        "conformal95 cov",
        "conformal95 width",
        "train s",
        "adapt s",
    ]
    rows = []
    for dataset, methods in data.items():
        ratios, conformal = matched_ratios(methods), matched_ratios(methods, conformal_reference=True)
        for method in sorted(methods, key=lambda m: order.index(m) if m in order else len(order)):
            s, theirs = methods[method], paper.get(dataset, {}).get(method, {})

            def ours(key: str, digits: int = 3, s=s, theirs=theirs) -> str:
                text = fmt(stat(s, "native", key), digits)
                return text + (f" [paper {theirs[key]:g}]" if key in theirs else "")

            adapt = stat(s, "cost", "adaptation_s")  # SA: its search; post hoc on the same weights: 0
            adapt = stat(s, "fit", "train_seconds") if adapt is None else adapt  # a baseline's own training
            rows.append(
                [
                    dataset,
                    method,
                    str(len(s)),
                    ours("nrmse"),
                    fmt(stat(s, "native", "mae")),
                    ours("pit_w1"),
                    ours("coverage_95", 2),
                    fmt(stat(s, "native", "width_95")),
                    fmt(ratios.get(method), 2),
                    fmt(conformal.get(method), 2),
                    fmt(stat(s, "temperature", "T"), 2),
                    fmt(stat(s, "temperature", "pit_w1")),
                    fmt(stat(s, "temperature", "coverage_95"), 2),
                    fmt(stat(s, "temperature", "width_95")),
                    fmt(stat(s, "conformal_95", "coverage"), 2),
                    fmt(stat(s, "conformal_95", "width")),
                    fmt(stat(s, "fit", "train_seconds"), 3),
                    fmt(adapt, 3),
                ]
            )
        for method, values in paper.get(dataset, {}).items():
            if method not in methods:
                cells = {"nrmse": 3, "pit_w1": 5, "coverage_95": 6}
                row = [dataset, f"paper: {method} (not run)", "-", *["-"] * (len(columns) - 3)]
                for key, col in cells.items():
                    row[col] = f"{values[key]:g}" if key in values else "-"
                rows.append(row)
    note = (
        "native = the method's own samples (SA: post hoc on the deterministic model); TS = temperature-scaled on "
        "the calibration part; width @SA cov / SA: split-conformal width at SA's native coverage over SA's "
        "native width (> 1: wider than SA); / SA conformal: the same over SA's own split-conformal width at that "
        "coverage (every interval built alike); adapt s: SA's nu search, a baseline's training; units: "
        "standardised targets (forecast: the Informer StandardScaler units)"
    )
    return {"title": title, "note": note, "columns": columns, "rows": rows}


def nu_table(data: dict) -> dict[str, Any]:
    """SA's nu per dataset: the default BO, the published routine and the grid optimum, their L_SA and costs."""
    columns = [
        "dataset",
        "runs",
        "nu default (BO)",
        "nu published",
        "nu grid",
        "L_SA pub / default",
        "L_SA grid / default",
        "at bound",
        "BO s",
        "published s",
        "BO evals",
    ]
    rows = []
    for dataset, methods in data.items():
        searches = [r["sa"] for r in methods.get("sa", {}).values() if "sa" in r]
        if not searches:
            continue
        cmp = [s.get("comparison", {}) for s in searches]

        def nus(key: str, cmp=cmp) -> str:
            return " ".join(str(c.get(key, {}).get("nu")) for c in cmp) if any(cmp) else "-"

        def ratio(key: str, cmp=cmp) -> float | None:
            return mean(
                [
                    c[key]["loss"] / c["default"]["loss"]
                    for c in cmp
                    if c.get(key, {}).get("loss") is not None and c["default"]["loss"] > 0
                ]
            )

        bounds = [s["at_bound"] for s in searches if s.get("at_bound")]
        rows.append(
            [
                dataset,
                str(len(searches)),
                " ".join(str(s["nu"]) for s in searches),
                nus("published"),
                nus("grid"),
                fmt(ratio("published"), 2),
                fmt(ratio("grid"), 2),
                f"{len(bounds)} ({', '.join(sorted(set(bounds)))})" if bounds else "0",
                fmt(mean([s["wall_time_s"] for s in searches]), 2),
                fmt(mean([c.get("published", {}).get("wall_time_s") for c in cmp])),
                fmt(mean([s["n_evals"] for s in searches]), 2),
            ]
        )
    note = (
        "every run's nu listed (one per split); L_SA of each choice re-evaluated on the whole calibration part "
        "with the same draws (grid / default < 1: the grid found a lower L_SA); at bound: runs whose nu stayed on "
        "an edge of the widened bracket (low: even nu = 1 disperses less than the model errs)"
    )
    return {
        "title": "SA's nu search: default BO vs the published routine vs a grid",
        "note": note,
        "columns": columns,
        "rows": rows,
    }


def best_by(data: dict, metric: tuple[str, str], methods: tuple[str, ...] | None = None) -> dict[str, str]:
    """Per dataset, the method with the lowest mean of metric (restricted to `methods`)."""
    out = {}
    for dataset, rows in data.items():
        stats = {m: stat(s, *metric) for m, s in rows.items() if methods is None or m in methods}
        values = {m: v for m, v in stats.items() if v is not None}
        if values:
            out[dataset] = min(values, key=values.__getitem__)
    return out
