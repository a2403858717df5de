"""The offline report's pooled plots, one figure per dataset and kind, every row of the table side by side.

Read from each run's files (drive/learn/experiment.py writes RUN/predictions.npz: the test split's mean,
aleatoric_var, epistemic_var and y, (N, D) each; a forecasting task writes RUN/trajectory.npz: `back` (K, L), `truth`,
`mean`, `std` (K, H) in original units and `window` (K,)):
- reliability: observed frequency of PIT <= p against p (0.05 ... 0.95), predictions of all runs pooled;
- pit: PIT histograms (20 bins; flat = calibrated, U = too narrow, hump = too wide);
- trajectory: the NSAC paper's Figure 4: the first run's forecasts of K test windows with 50 / 90 % tubes;
- decomposition: the NSAC paper's Figure 3: aleatoric and epistemic std along the test rows (for the spiral,
  along the curve) and, for 2-D targets, the predicted curve with its 2-sigma aleatoric / epistemic bands;
- tubes: the NSAC paper's Figure 5: each row's first run along its RUN/tubes.npz trajectories (drive/observe/
  tube_plots.py), one panel per controller and trajectory;
- sa_pit, width_coverage, nu_search: the SA study's (drive/studies/offline/sa_plots.py, from RUN/sa_study.npz and the
  runs' metrics.json "study").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from drive import metrics
from drive.studies.offline import sa_plots
from drive.studies.offline.tubes import tubes


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _load(run_dirs: list[str], name: str = "predictions.npz") -> list[dict[str, np.ndarray]]:
    out = []
    for run in run_dirs:
        path = Path(run) / name
        if path.is_file():
            with np.load(path) as data:
                out.append({k: data[k] for k in data.files})
    return out


def _pit(preds: list[dict[str, np.ndarray]]) -> np.ndarray:
    return np.concatenate(
        [metrics.pit(p["mean"], p["aleatoric_var"] + p["epistemic_var"], p["y"]).ravel() for p in preds]
    )


def draw(results: dict[str, Any], plot_dir: Path) -> list[Path]:
    """Every plot the task names in results["report_plots"], for each dataset's headline table."""
    kinds = results.get("report_plots", ("reliability", "pit"))
    plot_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for table in results["tables"]:
        if table["test"] != "test" or not table["rows"]:
            continue
        name = table["key"].replace("/", "_")
        rows = {r["row"]: r["run_dirs"] for r in table["rows"]}
        for kind, fn in (
            ("reliability", reliability),
            ("pit", pit_histograms),
            ("trajectory", trajectories),
            ("decomposition", decomposition),
            ("tubes", tubes),
            *sa_plots.PLOTS.items(),
        ):
            if kind in kinds:
                path = fn(rows, plot_dir / f"{name}_{kind}.png", table["key"])
                if path is not None:
                    out.append(path)
    return out


def reliability(rows: dict[str, list[str]], path: Path, title: str) -> Path | None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--", label="calibrated")
    drawn = False
    for row, runs in rows.items():
        preds = _load(runs)
        if preds:
            levels, observed = metrics.calibration_curve(_pit(preds))
            ax.plot(levels, observed, marker="o", ms=3, lw=1.2, label=row)
            drawn = True
    ax.set(xlabel="quantile level p", ylabel="observed frequency of y <= q_p", title=f"{title}: reliability")
    ax.legend(fontsize=7)
    if drawn:
        return _save(fig, path, plt)
    _close(fig, plt)
    return None


def pit_histograms(rows: dict[str, list[str]], path: Path, title: str) -> Path | None:
    plt = _pyplot()
    loaded = {row: _load(runs) for row, runs in rows.items()}
    loaded = {row: preds for row, preds in loaded.items() if preds}
    if not loaded:
        return None
    fig, axes = plt.subplots(1, len(loaded), figsize=(2.6 * len(loaded), 2.6), squeeze=False, sharey=True)
    for ax, (row, preds) in zip(axes[0], loaded.items(), strict=True):
        ax.hist(_pit(preds), bins=20, range=(0, 1), density=True, color="C0", alpha=0.8)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_title(row, fontsize=9)
        ax.set_xlabel("PIT")
    fig.suptitle(f"{title}: PIT histograms", fontsize=10)
    return _save(fig, path, plt)


def trajectories(rows: dict[str, list[str]], path: Path, title: str) -> Path | None:
    plt = _pyplot()
    found = {row: _load(runs[:1], "trajectory.npz") for row, runs in rows.items()}
    loaded = {row: t[0] for row, t in found.items() if t}
    if not loaded:
        return None
    k = len(next(iter(loaded.values()))["window"])
    fig, axes = plt.subplots(len(loaded), k, figsize=(3.6 * k, 2.3 * len(loaded)), squeeze=False, sharex=True)
    for r, (row, t) in enumerate(loaded.items()):
        for i in range(min(k, len(t["window"]))):
            ax = axes[r][i]
            steps = np.arange(t["mean"].shape[1])
            for z, alpha in ((1.645, 0.2), (0.674, 0.4)):
                ax.fill_between(
                    steps, t["mean"][i] - z * t["std"][i], t["mean"][i] + z * t["std"][i], color="C0", alpha=alpha, lw=0
                )
            ax.plot(np.arange(-t["back"].shape[1], 0), t["back"][i], color="0.5", lw=0.9)
            ax.plot(steps, t["truth"][i], color="k", lw=1.1)
            ax.plot(steps, t["mean"][i], color="C0", lw=1.1)
            ax.set_title(f"{row}, window {int(t['window'][i])}", fontsize=8)
    fig.suptitle(f"{title}: forecasts with 50 / 90 % tubes (grey: look-back, black: truth)", fontsize=10)
    return _save(fig, path, plt)


def decomposition(rows: dict[str, list[str]], path: Path, title: str) -> Path | None:
    plt = _pyplot()
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Circle

    loaded = {row: _load(runs) for row, runs in rows.items()}
    loaded = {row: preds for row, preds in loaded.items() if preds}
    if not loaded:
        return None
    planar = next(iter(loaded.values()))[0]["mean"].shape[1] == 2
    cols = 2 if planar else 1
    fig, axes = plt.subplots(len(loaded), cols, figsize=(5.2 * cols, 3.2 * len(loaded)), squeeze=False)
    for r, (row, preds) in enumerate(loaded.items()):
        ale = np.mean([np.sqrt(p["aleatoric_var"]).mean(1) for p in preds], 0)  # (N,) over runs and dims
        epi = np.mean([np.sqrt(p["epistemic_var"]).mean(1) for p in preds], 0)
        ax = axes[r][-1]
        ax.plot(ale, label="aleatoric std", color="C1")
        ax.plot(epi, label="epistemic std", color="C2")
        ax.set(title=f"{row}: decomposition along the test rows", xlabel="test row (spiral: time step)", yscale="log")
        ax.legend(fontsize=7)
        if planar:
            p = preds[0]
            ax = axes[r][0]
            for var, color, label in (
                (p["aleatoric_var"], "C1", "2 sd aleatoric"),
                (p["epistemic_var"], "C2", "2 sd epistemic"),
            ):
                radius = 2 * np.sqrt(var.mean(1))  # discs of radius 2 sd around the predicted mean
                ax.add_collection(
                    PatchCollection(
                        [Circle(m, r) for m, r in zip(p["mean"], radius, strict=True)],
                        color=color,
                        alpha=0.08,
                        lw=0,
                        label=label,
                    )
                )
            ax.plot(p["y"][:, 0], p["y"][:, 1], color="k", lw=1, label="truth")
            ax.plot(p["mean"][:, 0], p["mean"][:, 1], color="C0", lw=1, ls="--", label="mean")
            ax.set(title=f"{row}: curve and bands (first run)", aspect="equal")
            ax.autoscale_view()
            ax.legend(fontsize=6)
    fig.suptitle(f"{title}: aleatoric / epistemic decomposition", fontsize=10)
    return _save(fig, path, plt)


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _close(fig, plt) -> None:
    plt.close(fig)
    return None
