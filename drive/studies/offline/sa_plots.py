"""The SA study's pooled plots (tasks sa-uci, sa-forecast), one figure per dataset, every method of every row.

Read from each run directory: RUN/sa_study.npz (`<method>_pit`, `<method>_pit_temperature`: the test PIT values of
the empirical predictive CDF, native and temperature-scaled) and RUN/metrics.json "study" (the split-conformal
width-coverage curve of each method; SA's nu search). Kinds (a task's REPORT_PLOTS):
- sa_pit: PIT histograms per method, native (filled) and after temperature scaling (outline), runs pooled;
- width_coverage: mean interval width against achieved test coverage, the split-conformal curve of each method
  (mean over runs per level) and SA's native 95 % interval as a star: matched coverage read off horizontally;
- nu_search: L_SA on the calibration part against nu, the grid of each run, the default BO's evaluations and the
  nu it chose (dashed), the published routine's (dotted).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _studies(run_dirs: list[str]) -> list[dict[str, dict]]:
    """Per run: {method: its study row} from metrics.json."""
    out = []
    for run in run_dirs:
        path = Path(run) / "metrics.json"
        if path.is_file():
            study = json.loads(path.read_text()).get("study", {})
            out.append(dict(study["methods"]) if "methods" in study else {study["method"]: study} if study else {})
    return out


def _all_runs(rows: dict[str, list[str]]) -> list[str]:
    return [run for runs in rows.values() for run in runs]


def sa_pit(rows: dict[str, list[str]], path: Path, title: str) -> Path | None:
    pits: dict[str, list[np.ndarray]] = {}
    for run in _all_runs(rows):
        file = Path(run) / "sa_study.npz"
        if file.is_file():
            with np.load(file) as data:
                for key in data.files:
                    pits.setdefault(key, []).append(data[key])
    methods = [k.removesuffix("_pit") for k in pits if k.endswith("_pit")]
    if not methods:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(methods), figsize=(2.5 * len(methods), 2.6), squeeze=False, sharey=True)
    for ax, method in zip(axes[0], methods, strict=True):
        ax.hist(np.concatenate(pits[f"{method}_pit"]), bins=20, range=(0, 1), density=True, color="C0", alpha=0.75)
        if f"{method}_pit_temperature" in pits:
            ax.hist(
                np.concatenate(pits[f"{method}_pit_temperature"]),
                bins=20,
                range=(0, 1),
                density=True,
                histtype="step",
                color="C3",
                lw=1.2,
            )
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_title(method, fontsize=9)
        ax.set_xlabel("PIT")
    fig.suptitle(f"{title}: PIT, native (filled) and temperature-scaled (red)", fontsize=10)
    return _save(fig, path, plt)


def width_coverage(rows: dict[str, list[str]], path: Path, title: str) -> Path | None:
    curves: dict[str, list[dict]] = {}
    for study in _studies(_all_runs(rows)):
        for method, row in study.items():
            curves.setdefault(method, []).append(row)
    if not curves:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for i, (method, found) in enumerate(curves.items()):
        cov = np.mean([r["curve"]["coverage"] for r in found], 0)
        widths = np.array([r["curve"]["width"] for r in found], dtype=float)  # (runs, levels); inf: too few cases
        finite = np.isfinite(widths)
        width = np.where(finite, widths, 0).sum(0) / np.maximum(finite.sum(0), 1)
        width[~finite.any(0)] = np.nan
        ax.plot(cov, width, marker=".", ms=4, lw=1.2, color=f"C{i}", label=f"{method} (conformal; star: native 95 %)")
        native = [(r["native"]["coverage_95"], r["native"]["width_95"]) for r in found]
        ax.plot(*np.mean(native, 0), marker="*", ms=11, color=f"C{i}", ls="none")
    ax.set(xlabel="test coverage", ylabel="mean interval width", title=f"{title}: width vs coverage")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path, plt)


def nu_search(rows: dict[str, list[str]], path: Path, title: str) -> Path | None:
    searches = [s["sa"]["sa"] for s in _studies(_all_runs(rows)) if "sa" in s.get("sa", {})]
    if not searches:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    for i, search in enumerate(searches):
        color = f"C{i % 10}"
        grid = search.get("comparison", {}).get("grid")
        if grid:
            ax.loglog(grid["nus"], grid["losses"], lw=1, color=color, alpha=0.6)
        bo = search["curve"]
        ax.loglog([c["nu"] for c in bo], [c["loss"] for c in bo], "o", ms=4, color=color)
        ax.axvline(search["nu"], color=color, ls="--", lw=0.8)
        published = search.get("comparison", {}).get("published", {}).get("nu")
        if published:
            ax.axvline(published, color=color, ls=":", lw=0.8)
    ax.set(
        xlabel="nu",
        ylabel="L_SA (calibration part)",
        title=f"{title}: grid (lines), BO (dots), BO choice (--), published (:)",
    )
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path, plt)


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


PLOTS = {"sa_pit": sa_pit, "width_coverage": width_coverage, "nu_search": nu_search}
