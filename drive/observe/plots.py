"""Plots of an interpretability trace: the NSAC paper's Figure 6 (the track map coloured by phi, kappa, psi, the
attention logit mean and the epistemic variance, from the values the model computed on that lap) and time series
of steering (mean +- 2 sigma against the shadow expert; band and axis cut at the steering range [-1, 1]),
epistemic variance (log scale, the fallback threshold dashed) and the gates of each head beside their mean, with
fallback engagements shaded. Titles name the policy by `portable_spec`: no absolute path of the machine.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from drive.observe.trace import portable_spec, read_trace
from sim_bridges.carracing.bridge import ACTION_HIGH, ACTION_LOW, ACTION_NAMES

MAP_PANELS = (("phi", "phi (long-term mean)"), ("kappa", "kappa (reversion rate)"), ("psi", "psi (noise)"),
              ("mu", "attention logit mean"), ("epistemic_var_steer", "epistemic var (steer)"))  # fmt: skip
GATES = ("kappa", "phi", "psi", "mu", "sigma2")
STEER = ACTION_NAMES.index("steer")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_trace(path: str | os.PathLike) -> list[Path]:
    """Figure 6 style track maps and time series for one trace, written beside it; returns the PNG paths."""
    path = Path(path)
    plt = _pyplot()
    out = []
    for suffix, fig in trace_figures(path).items():
        target = path.with_name(f"{path.stem}_{suffix}.png")
        fig.savefig(target, dpi=90)  # no tight_layout: 1 s per plot; each figure places its axes itself
        plt.close(fig)
        out.append(target)
    return out


def trace_figures(path: str | os.PathLike) -> dict[str, Any]:
    """The figures of one trace by file suffix: `map` (when the controller reports gates) and `timeseries`."""
    table, meta = read_trace(path)
    cols = {
        c: table.column(c).to_numpy(zero_copy_only=False)
        for c in table.column_names
        if not c.endswith(("_values", "frame"))
    }
    figures = {}
    panels = [(k, title) for k, title in MAP_PANELS if k in cols and np.isfinite(cols[k]).any()]
    if panels:
        figures["map"] = _track_maps(cols, meta, panels)
    figures["timeseries"] = _time_series(cols)
    return figures


def _track_maps(cols: dict[str, np.ndarray], meta: dict[str, Any], panels: list[tuple[str, str]]) -> Any:
    """One map per value in a grid of near-square cells (two or three columns), each with its colour bar beside it;
    the key (track, car, threshold) fills the spare cell after the maps, where it covers no track."""
    plt = _pyplot()
    from matplotlib.colors import LogNorm
    from matplotlib.lines import Line2D

    track = None if meta.get("track") is None else np.asarray(meta["track"])
    n_cols = 2 if len(panels) + 1 <= 4 else 3
    n_rows = -(-(len(panels) + 1) // n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(4.8 * n_cols, 3.5 * n_rows + 0.5), squeeze=False)
    cells = list(axes.flat)
    threshold = cols.get("fallback_threshold")
    shown_threshold = False
    for ax, (key, title) in zip(cells, panels, strict=False):
        if track is not None:
            loop = np.vstack([track, track[:1]])
            ax.plot(loop[:, 0], loop[:, 1], color="0.8", lw=6, zorder=0)
        values, norm, unit = cols[key], None, key
        if "var" in key:  # variances span decades (epistemic ~1e-6 beside aleatoric ~1e-2): a log colour scale
            values = np.maximum(values, 1e-12)
            finite = values[np.isfinite(values)]
            norm, unit = LogNorm(vmin=float(finite.min()), vmax=float(max(finite.max(), finite.min() * 10))), "log"
        sc = ax.scatter(cols["x"], cols["y"], c=values, s=6, cmap="viridis", norm=norm, zorder=1)
        bar = fig.colorbar(sc, ax=ax, shrink=0.8, pad=0.02)
        bar.set_label(f"{key} ({unit} scale)" if norm is not None else key, fontsize=7)
        bar.ax.tick_params(labelsize=7)
        if "epistemic" in key and threshold is not None and np.isfinite(threshold).any():
            bar.ax.axhline(float(np.nanmax(threshold)), color="red", lw=2)  # the gate's threshold on the scale
            shown_threshold = True
        ax.set_title(title, fontsize=10)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
    key_ax, *unused = cells[len(panels) :]
    for ax in (key_ax, *unused):
        ax.set_axis_off()
    handles = [
        Line2D([], [], color="0.8", lw=6, label="track"),
        Line2D(
            [],
            [],
            ls="",
            marker="o",
            ms=4,
            color=plt.get_cmap("viridis")(0.6),
            label="car, coloured by the map's value\n(its colour bar beside it)",
        ),
    ]
    if shown_threshold:
        handles.append(Line2D([], [], color="red", lw=2, label="fallback threshold\n(on the colour bar)"))
    key_ax.legend(handles=handles, loc="center", fontsize=8, frameon=False)
    policy = portable_spec(str(meta.get("policy", "")))  # traces written before the recorder stored it portable
    fig.suptitle(f"seed {meta['seed']}: {policy} — values the model computed on this lap")
    fig.subplots_adjust(left=0.02, right=0.96, top=1 - 0.7 / fig.get_figheight(), bottom=0.03, wspace=0.2, hspace=0.15)
    return fig


def _time_series(cols: dict[str, np.ndarray]) -> Any:
    plt = _pyplot()
    t = cols["t"]
    rows = ["steer", "epistemic"] + [k for k in GATES if k in cols]
    fig, axes = plt.subplots(len(rows), 1, figsize=(12.5, 1.8 * len(rows)), sharex=True, squeeze=False)
    engaged = np.isin(cols["fallback"], ["expert", "slow"])
    for ax, key in zip(axes[:, 0], rows, strict=True):
        if key == "steer":
            sd = np.sqrt(cols["aleatoric_var_steer"] + cols["epistemic_var_steer"])
            # the Gaussian's band is cut at the action's range: the env clips any steering outside [-1, 1]
            lo, hi = float(ACTION_LOW[STEER]), float(ACTION_HIGH[STEER])
            band = np.clip(cols["mean_steer"] - 2 * sd, lo, hi), np.clip(cols["mean_steer"] + 2 * sd, lo, hi)
            ax.fill_between(t, *band, alpha=0.3, label="±2σ (cut at ±1)")
            ax.plot(t, cols["mean_steer"], lw=1, label="controller")
            if np.isfinite(cols["expert_steer"]).any():
                ax.plot(t, cols["expert_steer"], lw=1, color="green", label="shadow expert")
            ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
        elif key == "epistemic":
            for a in ACTION_NAMES:
                ax.semilogy(t, np.maximum(cols[f"epistemic_var_{a}"], 1e-12), lw=1, label=a)
            if np.isfinite(cols["fallback_threshold"]).any():
                ax.axhline(np.nanmax(cols["fallback_threshold"]), color="red", lw=1, ls="--", label="threshold")
        else:
            heads = sorted(int(m[1]) for c in cols if (m := re.fullmatch(rf"{key}_h(\d+)", c)))
            for i in heads:
                ax.plot(t, cols[f"{key}_h{i}"], lw=0.7, alpha=0.6, label=f"head {i}")
            ax.plot(t, cols[key], lw=1.4, color="black", label="mean over heads")
        if engaged.any():
            ax.fill_between(
                t,
                0,
                1,
                where=engaged,
                transform=ax.get_xaxis_transform(),
                color="red",
                alpha=0.12,
                label="fallback engaged",
            )
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, frameon=False)  # beside, never on, data
        ax.set_ylabel(key)
    axes[-1, 0].set_xlabel("step")
    fig.subplots_adjust(left=0.07, right=0.84, top=0.98, bottom=0.06, hspace=0.12)
    return fig
