"""The offline report's trajectory-with-tubes figure (the NSAC paper's Figure 5): one row per controller, one column
per panel of its first run's RUN/tubes.npz.

A task writes RUN/tubes.npz with, for every panel P (a test bearing, ...), `P/x` (position along the trajectory,
e.g. Time), `P/y` (the target), `P/mean`, `P/aleatoric_var` and `P/epistemic_var`, (N,) each. Each cell draws the
target, the predictive mean, the central 50 % and 90 % intervals of the total variance and, inside them, the 90 %
interval of the epistemic part alone: the aleatoric / epistemic split along the trajectory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

Z50, Z90 = 0.6744897501960817, 1.6448536269514722  # half-widths of the central 50 / 90 % of N(0, 1)
FILE = "tubes.npz"


def _panels(run_dir: str) -> dict[str, dict[str, np.ndarray]]:
    path = Path(run_dir) / FILE
    if not path.is_file():
        return {}
    panels: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path) as data:
        for key in data.files:
            name, _, field = key.rpartition("/")
            panels.setdefault(name, {})[field] = data[key]
    return panels


def tubes(rows: dict[str, list[str]], path: Path, title: str) -> Path | None:
    """rows: {table row: its run directories}; draws the first run of each row that has a tubes.npz."""
    loaded = {row: _panels(runs[0]) for row, runs in rows.items() if runs}
    loaded = {row: panels for row, panels in loaded.items() if panels}
    if not loaded:
        return None
    names = list(next(iter(loaded.values())))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(loaded), len(names), figsize=(3.0 * len(names), 2.2 * len(loaded)), squeeze=False, sharex="col", sharey=True
    )
    for r, (row, panels) in enumerate(loaded.items()):
        for c, name in enumerate(names):
            if name in panels:
                _cell(axes[r][c], panels[name])
            axes[r][c].set_title(f"{row} | {name}", fontsize=7)
            axes[r][c].tick_params(labelsize=6)
    axes[0][0].legend(fontsize=6, loc="upper left")
    fig.suptitle(f"{title}: target (black), mean, 50 / 90 % total tubes (blue), 90 % epistemic (green)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _cell(ax: Any, p: dict[str, np.ndarray]) -> None:
    order = np.argsort(p["x"], kind="stable")
    x, y, mean = p["x"][order], p["y"][order], p["mean"][order]
    total, epi = np.sqrt(p["aleatoric_var"] + p["epistemic_var"])[order], np.sqrt(p["epistemic_var"])[order]
    ax.fill_between(x, mean - Z90 * total, mean + Z90 * total, color="tab:blue", alpha=0.18, lw=0, label="90 %")
    ax.fill_between(x, mean - Z50 * total, mean + Z50 * total, color="tab:blue", alpha=0.35, lw=0, label="50 %")
    ax.fill_between(x, mean - Z90 * epi, mean + Z90 * epi, color="tab:green", alpha=0.5, lw=0, label="90 % epistemic")
    ax.plot(x, mean, color="tab:blue", lw=0.5, label="mean")
    ax.plot(x, y, color="k", lw=0.9, label="target")
    lo, hi = float(np.min(y)), float(np.max(y))
    pad = 0.3 * (hi - lo or 1.0)
    ax.set_ylim(lo - pad, hi + pad)
