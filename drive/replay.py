"""`drive replay TRACE --out video.mp4`: an episode trace (drive/recorder.py) rendered with the uncertainty overlay.

Each recorded step becomes one video frame: the raw 96x96 RGB frame when the trace holds it (recorded with
keep_raw), else the controller's own 84x84 grayscale frame, upscaled, beside the overlay panel of drive/overlay.py
(steering mean +-2 sigma, the shadow expert's steering, aleatoric/epistemic bars, kappa/phi/psi gauges, fallback
state) — the same drawing `drive drive` shows live.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

from drive.overlay import FRAME_SIZE, OverlayState, draw_overlay
from drive.recorder import read_trace


@dataclass(frozen=True)
class Config:
    trace: Annotated[Path, tyro.conf.Positional]
    """episode trace (trace_seedNNNNNN.parquet written by the recorder, e.g. `drive eval --trace DIR`)"""
    out: Path = Path("replay.mp4")
    """output video (mp4)"""
    fps: int = 50
    """frames per second of the video (CarRacing runs at 50 steps/s)"""
    every: int = 1
    """write every n-th step (2 halves the video length)"""
    frame_size: int = FRAME_SIZE
    """side of the upscaled driving frame in pixels"""


def trace_frames(path: Path, every: int = 1, frame_size: int = FRAME_SIZE):
    """Yield the overlay frames (H, W, 3) RGB uint8 of a trace, one per (every-th) step."""
    table, meta = read_trace(path)
    columns = [c for c in table.column_names if not c.endswith("_values")]
    rows = table.select(columns).to_pylist()
    raw_shape = meta.get("frame_shape")
    k, h, w = meta["obs_shape"]
    for row in rows[::every]:
        if raw_shape is not None and row.get("frame") is not None:
            frame = np.frombuffer(row["frame"], np.uint8).reshape(raw_shape)
        else:
            frame = np.frombuffer(row["obs_frame"], np.uint8).reshape(h, w)
        yield draw_overlay(frame, OverlayState.from_row(row), frame_size)


def replay(path: Path, out: Path, fps: int = 50, every: int = 1, frame_size: int = FRAME_SIZE) -> int:
    """Write the video; returns the number of frames written."""
    from drive.video import VideoWriter

    if every < 1:
        raise ValueError(f"--every must be >= 1, got {every}")
    with VideoWriter(out, fps=fps) as video:
        for image in trace_frames(Path(path), every, frame_size):
            video.write(image)
    return video.n_frames


def run(cfg: Config) -> int:
    try:
        n = replay(cfg.trace, cfg.out, cfg.fps, cfg.every, cfg.frame_size)
    except (FileNotFoundError, ValueError) as exc:
        print(f"drive replay: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {cfg.out} ({n} frames at {cfg.fps} fps)")
    return 0
