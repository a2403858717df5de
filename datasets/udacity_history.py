"""Frame history for Udacity steering controllers: the previous camera frames stacked with the current one.

A controller trained with `task.frames=F` (F >= 2) sees (3 F, 66, 200): the F most recent preprocessed center frames
of the same segment, oldest first, the current frame last (`EncoderConfig(kind="nvidia", in_dim=F)`). One frame
cannot show when a keyboard driver taps (the labels in ../shared/data/udacity_lake are spikes of 2-4 frames), but
the change between frames shows the car's yaw, i.e. its response to the taps just before: the steering at t has a
lag-1 autocorrelation of 0.82 on the lake log. This is also the copycat shortcut of de Haan et al. 2019 (a clone
that reads its own previous action from the frames): it wins offline and may drive worse in closed loop, where the
previous action was its own. Offline figures alone cannot settle that; docs/udacity.md says what was measured
(also two re-codings of the stack that did not beat plain early fusion: frame differences, and the phase-correlation
image shift between frames as extra input planes).

- `history_rows(t, F, max_gap_s)`: for each row of a log, the F rows it stacks. At the start of a segment (the first
  frame, or after a gap longer than max_gap_s) the earliest frame of the segment repeats: time never flows across a
  gap, so a stack never mixes two stretches of driving.
- `stack_history(frames, rows)`: (N, 3, 66, 200) preprocessed frames -> (N, 3 F, 66, 200) stacks.
- `FrameHistory(F)`: the same stacking for live frames (`drive udacity drive`); `reset()` at a new connection or
  after a pause, so the first stack repeats its first frame exactly as training saw segment starts.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from datasets.udacity_laps import segments


def history_rows(t: np.ndarray, n_frames: int, max_gap_s: float = 1.0) -> np.ndarray:
    """(N, n_frames) row indices, oldest first, the row itself last; clamped to the start of its segment."""
    if n_frames < 1:
        raise ValueError(f"n_frames must be >= 1, got {n_frames}")
    n = len(t)
    seg = segments(np.asarray(t, dtype=np.float64), max_gap_s)
    start = np.zeros(n, dtype=np.int64)  # first row of each row's segment
    if n:
        first = np.concatenate([[0], np.flatnonzero(np.diff(seg)) + 1])
        start = first[seg]
    lags = np.arange(n_frames - 1, -1, -1)  # (F,) n_frames-1 ... 0
    rows = np.arange(n)[:, None] - lags[None, :]  # (N, F)
    return np.maximum(rows, start[:, None])


def stack_history(frames: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """frames (N, 3, H, W), rows (M, F) into them -> (M, 3 F, H, W), oldest frame's channels first."""
    out = frames[rows]  # (M, F, 3, H, W)
    return out.reshape(out.shape[0], -1, *frames.shape[2:])


class FrameHistory:
    """Live stacking: push each preprocessed (3, H, W) frame, get the (3 F, H, W) stack the controller takes."""

    def __init__(self, n_frames: int):
        if n_frames < 1:
            raise ValueError(f"n_frames must be >= 1, got {n_frames}")
        self.n_frames = n_frames
        self._frames: deque[np.ndarray] = deque(maxlen=n_frames)

    def reset(self) -> None:
        self._frames.clear()

    def push(self, frame: np.ndarray) -> np.ndarray:
        self._frames.append(frame)
        pad = [self._frames[0]] * (self.n_frames - len(self._frames))  # a segment start repeats its first frame
        return np.concatenate([*pad, *self._frames], axis=0)
