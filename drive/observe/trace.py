"""Interpretability recorder: an `on_step` observer writing one tidy Parquet trace per episode (plots beside it).

Per step (one row; `t` is the step index, the row describes the state the controller saw and what it did):

    seed, t, reward, return (cumulative), done
    x, y, heading, speed, progress, tiles_visited, off_track, track_pos     car pose and track position (track_pos:
                                            fraction of the lap along the centreline at the closest point, in [0, 1))
    action_{steer,gas,brake}                the executed action;  source: who chose it (policy / expert / slow)
    mean_*, aleatoric_var_*, epistemic_var_*   the controller's predictive mean and variances per action
    expert_*                                the shadow expert's action on the same state (NaN without one)
    latency_ms, fallback, fallback_score, fallback_threshold, fallback_signal
    for each internal tensor N of the controller (NSAC: kappa, phi, psi, mu = logit mean, sigma2 = logit variance,
    attention = attention weights, ou_time = the OU integration time per head; indices such as `keys`, the key of
    each slot, are kept as N_values only):
        N            the summary: mean over heads, queries and keys (and samples, for attention)
        N_h{i}       the mean for head i (the head axis is the controller's `internal_head_axes`)
        N_values     every value, flattened (list<float32>); the shape is in the file metadata
    obs_frame       the newest coded 84x84 frame the controller saw (uint8 bytes): with the rule "the stack at t is
                    frames t-k+1..t, clamped at 0" its exact input can be rebuilt from the trace
    frame           the raw 96x96 RGB frame (the env's observation), for replays

File metadata (key b"drive"): JSON with the track centreline (N, 2), internal shapes and head axes, frame shapes,
policy name (its path relative to the working directory, or the file name: never an absolute path of the machine).
The recorder is drive/observe/trace_recorder.py; drive/observe/plots.py draws the NSAC paper's Figure 6 from a trace.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datasets.files import atomic_path
from drive.errors import UserError

META_KEY = b"drive"
REQUIRED = ("t", "mean_steer", "action_steer")


def portable_path(path: str | os.PathLike) -> str:
    """A path as an output shows it: relative to the working directory when it lies inside it, its file name when
    it is absolute elsewhere, as given otherwise — never the machine's absolute path (traces and plots are shared)."""
    path = Path(path)
    if not path.is_absolute():
        return str(path)
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return path.name


def portable_spec(spec: str) -> str:
    """A policy spec (`ckpt:PATH`, `expert:PATH`, `expert:ppo`, or a bare path) with its path shown by
    `portable_path`."""
    if Path(spec).is_absolute():
        return portable_path(spec)
    kind, sep, arg = spec.partition(":")
    return f"{kind}:{portable_path(arg)}" if sep and arg else spec


def write_trace(path: str | os.PathLike, rows: list[dict[str, Any]], meta: dict[str, Any]) -> Path:
    """One episode's rows and metadata as a Parquet trace, written atomically."""
    path = Path(path)
    table = pa.Table.from_pylist(rows).replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


# -- reading -----------------------------------------------------------------------------------------------------------
def read_trace(path: str | os.PathLike) -> tuple[pa.Table, dict[str, Any]]:
    """A trace table and its metadata; a clear error naming the file when it is not a readable trace."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such trace file")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"{path}: not a readable Parquet trace ({' '.join(str(exc).split())})") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise UserError(f"{path}: Parquet file without drive trace metadata (not written by drive.observe.trace)")
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise UserError(f"{path}: trace lacks column(s) {missing}")
    try:
        return table, json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{path}: corrupt trace metadata") from None


def observation_stacks(table: pa.Table, meta: dict[str, Any], k: int = 4) -> np.ndarray:
    """Rebuild the controller's inputs (T, k, 84, 84) from the recorded newest coded frames."""
    if "obs_frame" not in table.column_names or meta.get("obs_shape") is None:
        raise UserError("this trace holds no coded frames (the policy was not a frame controller)")
    h, w = meta["obs_shape"]
    frames = np.stack([np.frombuffer(b, np.uint8).reshape(h, w) for b in table.column("obs_frame").to_pylist()])
    idx = np.maximum(np.arange(len(frames))[:, None] + np.arange(-k + 1, 1)[None], 0)  # (T, k)
    return frames[idx]
