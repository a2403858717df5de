"""The interpretability recorder: an `on_step` observer that writes each episode as a trace (drive/observe/trace.py
documents the columns) and, by default, its plots (drive/observe/plots.py) beside it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from drive.loop.rollout import Internals, StepRecord
from drive.observe.plots import plot_trace
from drive.observe.trace import portable_spec, write_trace
from sim_bridges.carracing.bridge import ACTION_NAMES

log = logging.getLogger(__name__)


def track_polyline(env: Any) -> np.ndarray | None:
    """The centreline (N, 2) of a CarRacing track (env.unwrapped.track: (alpha, beta, x, y) per tile), else None."""
    track = getattr(getattr(env, "unwrapped", env), "track", None)
    if not track:
        return None
    return np.array([(p[2], p[3]) for p in track], dtype=np.float64)


def _triple(prefix: str, values: Any) -> dict[str, float]:
    if values is None:
        return {f"{prefix}_{a}": float("nan") for a in ACTION_NAMES}
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    return {f"{prefix}_{a}": float(v) for a, v in zip(ACTION_NAMES, values, strict=True)}


def internal_columns(internals: Internals, taken: set[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Columns for every internal tensor (summary, per-head means, flattened values) and their shapes/head axes."""
    cols: dict[str, Any] = {}
    shapes: dict[str, dict[str, Any]] = {}
    for name, raw in internals.values.items():
        key = f"internal_{name}" if name in taken else name  # never let an internal overwrite a step column
        value = np.asarray(raw, dtype=np.float32)
        cols[f"{key}_values"] = value.reshape(-1).tolist()
        axis = internals.head_axes.get(name)
        if name in internals.indices:
            shapes[key] = {"shape": list(value.shape), "head_axis": None}
            continue
        cols[key] = float(value.mean())
        if axis is not None and value.ndim > axis:
            per_head = np.moveaxis(value, axis, 0).reshape(value.shape[axis], -1).mean(1)
            cols.update({f"{key}_h{i}": float(v) for i, v in enumerate(per_head)})
        else:
            axis = None
        shapes[key] = {"shape": list(value.shape), "head_axis": axis}
    return cols, shapes


class TraceRecorder:
    """Observer: collects rows for each episode and writes `out_dir/trace_seed{seed:06d}.parquet` when it ends.

    env: the env being driven (for the track centreline); plots: also write the PNG plots beside each trace.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike,
        env: Any = None,
        plots: bool = True,
        frames: bool = True,
        policy_name: str = "",
        on_episode: Callable[[Path], None] | None = None,
    ):
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
        self.obs_shape: list[int] | None = None
        self.track: np.ndarray | None = None
        self._total = 0.0

    def __call__(self, record: StepRecord) -> None:
        if record.t == 0:
            self._start()
            self.track = track_polyline(self.env) if self.env is not None else None
        self._total += record.reward
        row = self._step_columns(record)
        out = record.output
        if out.internals is not None:
            cols, shapes = internal_columns(out.internals, set(row))
            row.update(cols)
            self.shapes.update(shapes)
        if out.frame is not None:
            row["obs_frame"] = np.ascontiguousarray(out.frame, np.uint8).tobytes()
            self.obs_shape = list(np.shape(out.frame))
        obs = np.asarray(record.obs)
        if self.frames and obs.ndim == 3 and obs.dtype == np.uint8:
            self.frame_shape = list(obs.shape)
            row["frame"] = np.ascontiguousarray(obs).tobytes()
        self.rows.append(row)
        if record.done:
            self._write(record.seed)

    def _step_columns(self, record: StepRecord) -> dict[str, Any]:
        info, out = record.info, record.output
        pose = np.asarray(info.get("pose", (np.nan, np.nan, np.nan)), dtype=np.float64)
        pred, gate = out.prediction, out.gate
        return {
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
            **_triple("mean", None if pred is None else pred.mean),
            **_triple("aleatoric_var", None if pred is None else pred.aleatoric_var),
            **_triple("epistemic_var", None if pred is None else pred.epistemic_var),
            **_triple("expert", out.expert),
            "latency_ms": float(out.latency_ms),
            "fallback": "off" if gate is None else gate.state,
            "fallback_score": float("nan") if gate is None else float(gate.score),
            "fallback_threshold": float("nan") if gate is None else float(gate.threshold),
            "fallback_signal": "steer" if gate is None else gate.signal,
        }

    def _track_pos(self, xy: np.ndarray) -> float:
        if self.track is None or not np.all(np.isfinite(xy)):
            return float("nan")
        i = int(np.argmin(np.sum((self.track - xy[None]) ** 2, axis=1)))
        return i / len(self.track)

    def _write(self, seed: int) -> None:
        meta = {
            "policy": portable_spec(self.policy_name),
            "seed": int(seed),
            "n_steps": len(self.rows),
            "internals": self.shapes,
            "obs_shape": self.obs_shape,
            "frame_shape": self.frame_shape,
            "track": None if self.track is None else self.track.round(3).tolist(),
        }
        path = write_trace(self.out_dir / f"trace_seed{int(seed):06d}.parquet", self.rows, meta)
        self.paths.append(path)
        log.info("trace of seed %d (%d steps) -> %s", seed, len(self.rows), path)
        if self.plots:
            plot_trace(path)
        if self.on_episode is not None:
            self.on_episode(path)


def trace_observer(out_dir: str | os.PathLike, env: Any, policy_name: str) -> TraceRecorder:
    """The recorder for one worker's env (the factory `drive.loop.evaluate` calls inside each worker)."""
    return TraceRecorder(out_dir, env=env, policy_name=policy_name)
