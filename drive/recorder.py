"""Interpretability recorder: an `on_step` observer writing one tidy Parquet trace per episode, plus plots.

Per step (one row; `t` is the step index, the row describes the state the controller saw and what it did):

    seed, t, reward, return (cumulative), done
    x, y, heading, speed, progress, tiles_visited, off_track, track_pos     car pose and track position (track_pos:
                                            fraction of the lap along the centreline at the closest point, in [0, 1))
    action_{steer,gas,brake}                the executed action;  source: who chose it (policy / expert / slow)
    mean_*, aleatoric_var_*, epistemic_var_*   the controller's predictive mean and variances per action
    expert_*                                the shadow expert's action on the same state (NaN without one)
    latency_ms, fallback, fallback_score, fallback_threshold, fallback_signal
    for each internal tensor N of the controller (NSAC: kappa, phi, psi, mu = logit mean, sigma2 = logit variance,
    attention = attention weights, ou_time = the OU integration time per head; `keys`, the key index of each
    slot, is kept as keys_values only):
        N            the summary: mean over heads, queries and keys (and samples, for attention)
        N_h{i}       the mean for head i
        N_values     every value, flattened (list<float32>); the shape is in the file metadata
    obs_frame       the newest 84x84 frame of the observation (uint8 bytes): with the rule "the stack at t is frames
                    t-k+1..t, clamped at 0" the controller's exact input can be rebuilt from the trace
    frame           the raw 96x96 RGB frame when the env keeps it (keep_raw), for replays

File metadata (key b"drive"): JSON with the track centreline (N, 2), internal shapes and head axes, frame shapes,
policy name. `plot_trace` draws the NSAC paper's Figure 6 from the model's real values — the track map coloured by
phi, kappa, psi, the logit mean and the epistemic uncertainty — and time series over the lap.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from drive.rollout import StepRecord

log = logging.getLogger(__name__)

ACTIONS = ("steer", "gas", "brake")
META_KEY = b"drive"
# the axis of each NSAC internal that holds the heads, after dropping the batch axis (see agents/nsac.py)
HEAD_AXIS = {"kappa": 0, "phi": 0, "psi": 0, "mu": 0, "sigma2": 0, "attention": 1, "ou_time": 0}
RENAME = {"t": "ou_time"}  # NSAC's OU integration time per head; `t` is the step column
SKIP_SUMMARY = ("keys",)


def track_polyline(env: Any) -> np.ndarray | None:
    """The centreline (N, 2) of a CarRacing track (env.unwrapped.track: (alpha, beta, x, y) per tile), else None."""
    track = getattr(getattr(env, "unwrapped", env), "track", None)
    if not track:
        return None
    return np.array([(p[2], p[3]) for p in track], dtype=np.float64)


def _triple(prefix: str, values: Any) -> dict[str, float]:
    if values is None:
        return {f"{prefix}_{a}": float("nan") for a in ACTIONS}
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    return {f"{prefix}_{a}": float(v) for a, v in zip(ACTIONS, values, strict=True)}


def summarise_internal(name: str, value: np.ndarray) -> tuple[dict[str, Any], list[int], int | None]:
    """Columns for one internal tensor: summary mean, per-head means, flattened values; plus (shape, head axis)."""
    value = np.asarray(value, dtype=np.float32)
    if value.ndim >= 1 and value.shape[0] == 1 and name != "attention":
        value = value[0]  # drop the batch axis (B = 1 in the closed loop)
    elif name == "attention" and value.ndim >= 2 and value.shape[1] == 1:
        value = value[:, 0]  # (S, 1, H, ...) -> (S, H, ...)
    cols: dict[str, Any] = {name: float(value.mean()), f"{name}_values": value.reshape(-1).tolist()}
    axis = HEAD_AXIS.get(name)
    if axis is not None and value.ndim > axis:
        per_head = np.moveaxis(value, axis, 0).reshape(value.shape[axis], -1).mean(1)
        cols.update({f"{name}_h{i}": float(v) for i, v in enumerate(per_head)})
    else:
        axis = None
    return cols, list(value.shape), axis


class TraceRecorder:
    """Observer: collects rows for each episode and writes `out_dir/trace_seed{seed:06d}.parquet` when it ends.

    env: the env being driven (for the track centreline); plots: also write the PNG plots beside each trace.
    """

    def __init__(self, out_dir: str | os.PathLike, env: Any = None, plots: bool = True, frames: bool = True,
                 policy_name: str = "", on_episode: Callable[[Path], None] | None = None):  # fmt: skip
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.env, self.plots, self.frames, self.policy_name = env, plots, frames, policy_name
        self.on_episode = on_episode
        self.paths: list[Path] = []
        self._start()

    def _start(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.shapes: dict[str, dict[str, Any]] = {}
        self.frame_shape: list[int] | None = None
        self.track: np.ndarray | None = None
        self._total = 0.0

    def __call__(self, record: StepRecord) -> None:
        if record.t == 0:
            self._start()
            self.track = track_polyline(self.env) if self.env is not None else None
        info, extras = record.info, record.extras
        self._total += record.reward
        pose = np.asarray(info.get("pose", (np.nan, np.nan, np.nan)), dtype=np.float64)
        row: dict[str, Any] = {
            "seed": int(record.seed),
            "t": int(record.t),
            "reward": float(record.reward),
            "return": float(self._total),
            "done": bool(record.done),
            "x": float(pose[0]),
            "y": float(pose[1]),
            "heading": float(pose[2]),
            "speed": float(info.get("speed", np.nan)),
            "progress": float(info.get("progress", np.nan)),
            "tiles_visited": int(info.get("tiles_visited", -1)),
            "off_track": bool(info.get("off_track", False)),
            "track_pos": self._track_pos(pose[:2]),
            "source": str(record.source),
            **_triple("action", record.action),
            **_triple("mean", extras.get("mean")),
            **_triple("aleatoric_var", extras.get("aleatoric_var")),
            **_triple("epistemic_var", extras.get("epistemic_var")),
            **_triple("expert", extras.get("expert")),
            "latency_ms": float(extras.get("latency_ms", np.nan)),
            "fallback": str(extras.get("fallback", "off")),
            "fallback_score": float(extras.get("fallback_score", np.nan)),
            "fallback_threshold": float(extras.get("fallback_threshold", np.nan)),
            "fallback_signal": str(extras.get("fallback_signal", "steer")),
        }
        for name, value in (extras.get("internals") or {}).items():
            name = RENAME.get(name, name)
            if name in row:  # never let an internal overwrite a step column
                name = f"internal_{name}"
            if name in SKIP_SUMMARY:  # indices, not values: kept whole, not averaged
                row[f"{name}_values"] = np.asarray(value).reshape(-1).tolist()
                self.shapes[name] = {"shape": list(np.shape(value)), "head_axis": None}
                continue
            cols, shape, axis = summarise_internal(name, value)
            row.update(cols)
            self.shapes[name] = {"shape": shape, "head_axis": axis}
        obs = np.asarray(record.obs)
        row["obs_frame"] = np.ascontiguousarray(obs[-1]).tobytes()  # (84, 84) newest frame
        raw = info.get("raw_frame")
        if self.frames and raw is not None:
            raw = np.ascontiguousarray(raw, dtype=np.uint8)
            self.frame_shape = list(raw.shape)
            row["frame"] = raw.tobytes()
        self.rows.append(row)
        if record.done:
            self._write(record.seed, list(obs.shape))

    def _track_pos(self, xy: np.ndarray) -> float:
        if self.track is None or not np.all(np.isfinite(xy)):
            return float("nan")
        i = int(np.argmin(np.sum((self.track - xy[None]) ** 2, axis=1)))
        return i / len(self.track)

    def _write(self, seed: int, obs_shape: list[int]) -> None:
        meta = {
            "policy": self.policy_name,
            "seed": int(seed),
            "n_steps": len(self.rows),
            "internals": self.shapes,
            "obs_shape": obs_shape,
            "frame_shape": self.frame_shape,
            "track": None if self.track is None else self.track.round(3).tolist(),
        }
        table = pa.Table.from_pylist(self.rows)
        table = table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
        path = self.out_dir / f"trace_seed{int(seed):06d}.parquet"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
        self.paths.append(path)
        log.info("trace of seed %d (%d steps) -> %s", seed, len(self.rows), path)
        if self.plots:
            plot_trace(path)
        if self.on_episode is not None:
            self.on_episode(path)


# -- reading -----------------------------------------------------------------------------------------------------------
def read_trace(path: str | os.PathLike) -> tuple[pa.Table, dict[str, Any]]:
    """A trace table and its metadata; a clear error naming the file when it is not a readable trace."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such trace file")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{path}: not a readable Parquet trace ({exc})") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise ValueError(f"{path}: Parquet file without drive trace metadata (not written by drive.recorder)")
    missing = [c for c in ("t", "obs_frame", "mean_steer") if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: trace lacks column(s) {missing}")
    return table, json.loads(raw)


def observation_stacks(table: pa.Table, meta: dict[str, Any]) -> np.ndarray:
    """Rebuild the controller's inputs (T, k, 84, 84) from the recorded newest frames."""
    k, h, w = meta["obs_shape"]
    frames = np.stack([np.frombuffer(b, np.uint8).reshape(h, w) for b in table.column("obs_frame").to_pylist()])
    idx = np.maximum(np.arange(len(frames))[:, None] + np.arange(-k + 1, 1)[None], 0)  # (T, k)
    return frames[idx]


# -- plots -------------------------------------------------------------------------------------------------------------
MAP_PANELS = (("phi", "phi (long-term mean)"), ("kappa", "kappa (reversion rate)"), ("psi", "psi (noise)"),
              ("mu", "attention logit mean"), ("epistemic_var_steer", "epistemic var (steer)"))  # fmt: skip


def plot_trace(path: str | os.PathLike) -> list[Path]:
    """Figure 6 style track maps and time series for one trace; returns the PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    table, meta = read_trace(path)
    cols = {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names if not c.endswith(
        ("_values", "frame"))}  # fmt: skip
    track = None if meta.get("track") is None else np.asarray(meta["track"])
    panels = [(k, title) for k, title in MAP_PANELS if k in cols and np.isfinite(cols[k]).any()]
    out = []
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
        for ax, (key, title) in zip(axes[0], panels, strict=True):
            if track is not None:
                loop = np.vstack([track, track[:1]])
                ax.plot(loop[:, 0], loop[:, 1], color="0.8", lw=6, zorder=0)
            sc = ax.scatter(cols["x"], cols["y"], c=cols[key], s=6, cmap="viridis", zorder=1)
            fig.colorbar(sc, ax=ax, shrink=0.75)
            ax.set_title(title)
            ax.set_aspect("equal")
            ax.set_xticks([])
            ax.set_yticks([])
        fig.suptitle(f"seed {meta['seed']}: {meta.get('policy', '')} — values the model computed on this lap")
        fig.subplots_adjust(left=0.02, right=0.97, top=0.85, bottom=0.03, wspace=0.15)  # tight_layout: 1 s per plot
        out.append(path.with_name(path.stem + "_map.png"))
        fig.savefig(out[-1], dpi=90)
        plt.close(fig)

    t = cols["t"]
    rows = [("steer", None), ("epistemic", None)] + [(k, None) for k in ("kappa", "phi", "psi", "mu", "sigma2")
                                                       if k in cols]  # fmt: skip
    fig, axes = plt.subplots(len(rows), 1, figsize=(11, 1.8 * len(rows)), sharex=True, squeeze=False)
    engaged = np.isin(cols["fallback"], ["expert", "slow"])
    for ax, (key, _) in zip(axes[:, 0], rows, strict=True):
        if key == "steer":
            sd = np.sqrt(cols["aleatoric_var_steer"] + cols["epistemic_var_steer"])
            ax.fill_between(t, cols["mean_steer"] - 2 * sd, cols["mean_steer"] + 2 * sd, alpha=0.3, label="±2σ")
            ax.plot(t, cols["mean_steer"], lw=1, label="controller")
            if np.isfinite(cols["expert_steer"]).any():
                ax.plot(t, cols["expert_steer"], lw=1, color="green", label="shadow expert")
            ax.legend(loc="upper right", fontsize=7, ncol=3)
        elif key == "epistemic":
            for a in ACTIONS:
                ax.semilogy(t, np.maximum(cols[f"epistemic_var_{a}"], 1e-12), lw=1, label=a)
            if np.isfinite(cols["fallback_threshold"]).any():
                ax.axhline(np.nanmax(cols["fallback_threshold"]), color="red", lw=1, ls="--", label="threshold")
            ax.legend(loc="upper right", fontsize=7, ncol=4)
        else:
            heads = sorted(c for c in cols if c.startswith(f"{key}_h"))
            for h in heads:
                ax.plot(t, cols[h], lw=0.7, alpha=0.6)
            ax.plot(t, cols[key], lw=1.4, color="black", label="mean over heads")
        if engaged.any():
            ax.fill_between(t, 0, 1, where=engaged, transform=ax.get_xaxis_transform(), color="red", alpha=0.12)
        ax.set_ylabel(key)
    axes[-1, 0].set_xlabel("step")
    fig.subplots_adjust(left=0.08, right=0.98, top=0.98, bottom=0.06, hspace=0.12)
    out.append(path.with_name(path.stem + "_timeseries.png"))
    fig.savefig(out[-1], dpi=90)
    plt.close(fig)
    return out
