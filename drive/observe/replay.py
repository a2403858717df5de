"""An episode trace rendered as a video with the uncertainty overlay (`drive replay`).

Each recorded step becomes one video frame: the raw 96x96 RGB frame when the trace holds it, else the controller's
own coded 84x84 frame, upscaled, beside the overlay panel of drive/observe/overlay.py (steering mean +-2 sigma, the
shadow expert's steering, aleatoric/epistemic bars, kappa/phi/psi gauges, fallback state) — the same drawing
`drive drive` shows live.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from drive.errors import UserError
from drive.observe.overlay import FRAME_SIZE, OverlayState, draw_overlay
from drive.observe.trace import read_trace
from drive.observe.video import VideoWriter


def trace_frames(path: Path, every: int = 1, frame_size: int = FRAME_SIZE) -> Iterator[np.ndarray]:
    """Yield the overlay frames (H, W, 3) RGB uint8 of a trace, one per (every-th) step."""
    table, meta = read_trace(path)
    columns = [c for c in table.column_names if not c.endswith("_values")]
    rows = table.select(columns).to_pylist()
    raw_shape, obs_shape = meta.get("frame_shape"), meta.get("obs_shape")
    if raw_shape is None and obs_shape is None:
        raise UserError(f"{path}: the trace holds no frames to draw")
    for row in rows[::every]:
        if raw_shape is not None and row.get("frame") is not None:
            frame = np.frombuffer(row["frame"], np.uint8).reshape(raw_shape)
        else:
            frame = np.frombuffer(row["obs_frame"], np.uint8).reshape(obs_shape)
        yield draw_overlay(frame, OverlayState.from_row(row), frame_size)


def replay(path: Path, out: Path, fps: int = 50, every: int = 1, frame_size: int = FRAME_SIZE) -> int:
    """Write the video; returns the number of frames written."""
    if every < 1:
        raise UserError(f"--every must be >= 1, got {every}")
    if fps < 1 or frame_size < 16:
        raise UserError(f"--fps must be >= 1 and --frame-size >= 16, got {fps} and {frame_size}")
    with VideoWriter(out, fps=fps) as video:
        for image in trace_frames(Path(path), every, frame_size):
            video.write(image)
    return video.n_frames
