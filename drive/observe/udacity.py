"""Observers of a Udacity drive (`rollout`'s `on_step`): the per-step log and the uncertainty overlay.

- `StepLog`: one CSV row per step, flushed as it is written (a crash loses nothing), converted to Parquet on close.
- `Overlay`: the camera frame (x2) with the vision policy's traced road line, and a panel: steering with its
  +-2 sigma band (total predictive std), throttle, speed against the speed controller's target, aleatoric and
  epistemic std bars, the uncertainty gate. Shown in a pygame window, or written to an mp4 (cv2.VideoWriter, mp4v)
  when there is no display (SDL_VIDEODRIVER=dummy, no DISPLAY).
"""

from __future__ import annotations

import csv
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from drive.loop.rollout import StepRecord
from drive.observe.video import VideoWriter

log = logging.getLogger(__name__)

COLUMNS = (
    "episode", "t", "frame", "latency_ms", "speed_mph", "target_mph", "steering", "throttle", "mean", "aleatoric_std",
    "epistemic_std", "gated", "slowdown", "road_rows",
)  # fmt: skip
STD_FULL_SCALE = 0.5  # steering lives in [-1, 1]: a standard deviation of 0.5 is already huge
WHITE, GREY, DARK = (255, 255, 255), (140, 140, 140), (30, 30, 30)
GREEN, RED, ORANGE, BLUE, PURPLE = (60, 220, 60), (230, 50, 50), (250, 160, 30), (80, 150, 255), (190, 100, 240)


def step_row(rec: StepRecord) -> dict[str, Any]:
    """The log row of one step (the COLUMNS; empty where the policy reports nothing)."""
    out = rec.output
    row: dict[str, Any] = {
        "episode": rec.episode,
        "t": rec.t,
        "frame": rec.info.get("frame"),
        "latency_ms": out.latency_ms,
        "steering": float(rec.action[0]),
        "throttle": float(rec.action[1]),
    }
    if out.speed is not None:
        row.update(
            speed_mph=out.speed.speed_mph,
            target_mph=out.speed.target_mph,
            gated=out.speed.gated,
            slowdown=out.speed.slowdown,
        )
    if out.prediction is not None:
        row.update(
            mean=float(out.prediction.mean[0]),
            aleatoric_std=_std(out.prediction.aleatoric_var),
            epistemic_std=_std(out.prediction.epistemic_var),
        )
    if out.road is not None:
        row.update(mean=float(rec.action[0]), road_rows=out.road.rows)
    return row


def _std(var: np.ndarray) -> float:
    return math.sqrt(max(float(np.asarray(var).reshape(-1)[0]), 0.0))


class StepLog:
    """`steps.csv` (flushed per row) and, on close, `steps.parquet` in the run directory."""

    def __init__(self, run_dir: Path):
        self.csv_path, self.parquet_path = run_dir / "steps.csv", run_dir / "steps.parquet"
        self._file = open(self.csv_path, "w", newline="")  # noqa: SIM115 - closed in close()
        self._writer = csv.DictWriter(self._file, COLUMNS, extrasaction="ignore")
        self._writer.writeheader()
        self.latencies_ms: list[float] = []

    def __call__(self, rec: StepRecord) -> None:
        self._writer.writerow(step_row(rec))
        self._file.flush()
        self.latencies_ms.append(float(rec.output.latency_ms))

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.close()
        try:
            import pyarrow.csv as pacsv
            import pyarrow.parquet as pq

            pq.write_table(pacsv.read_csv(self.csv_path), self.parquet_path)
        except Exception as exc:  # an empty log, or pyarrow missing: the CSV is the record
            log.warning("no Parquet copy of %s: %s", self.csv_path, exc)


def _bar(img, x0, x1, y, value, lo, hi, color, label, text):
    cv2.rectangle(img, (x0, y - 7), (x1, y + 7), DARK, -1)
    zero = int(x0 + (x1 - x0) * (0 - lo) / (hi - lo)) if lo < 0 else x0
    v = int(x0 + (x1 - x0) * (min(max(value, lo), hi) - lo) / (hi - lo))
    cv2.rectangle(img, (min(zero, v), y - 6), (max(zero, v), y + 6), color, -1)
    cv2.putText(img, label, (6, y + 4), cv2.FONT_HERSHEY_SIMPLEX, 0.42, WHITE, 1, cv2.LINE_AA)
    cv2.putText(img, text, (x1 + 8, y + 4), cv2.FONT_HERSHEY_SIMPLEX, 0.42, WHITE, 1, cv2.LINE_AA)


def draw(rgb: np.ndarray, rec: StepRecord) -> np.ndarray:
    """(160, 320, 3) frame + this step's numbers -> (450, 640, 3) uint8 overlay image."""
    frame = cv2.resize(rgb, (640, 320), interpolation=cv2.INTER_LINEAR)  # (320, 640, 3)
    out, row = rec.output, step_row(rec)
    if out.road is not None and len(out.road.line):
        grid_w, grid_h = out.road.grid
        line = out.road.line
        pts = np.stack([(line[:, 1] + 0.5) * 640 / grid_w, (line[:, 0] + 0.5) * 320 / grid_h], 1).astype(np.int32)
        cv2.polylines(frame, [pts], False, PURPLE, 2, cv2.LINE_AA)
    panel = np.zeros((130, 640, 3), np.uint8)
    steer, throttle = float(rec.action[0]), float(rec.action[1])
    ale, epi = row.get("aleatoric_std"), row.get("epistemic_std")
    x0, x1 = 110, 520
    _bar(panel, x0, x1, 16, steer, -1, 1, BLUE, "steering", f"{steer:+.3f}")
    if ale is not None and epi is not None and math.isfinite(ale) and math.isfinite(epi):
        sd = math.hypot(ale, epi)
        a, b = (int(x0 + (x1 - x0) * (min(max(s, -1), 1) + 1) / 2) for s in (steer - 2 * sd, steer + 2 * sd))
        cv2.line(panel, (a, 16), (b, 16), ORANGE, 2)
        _bar(panel, x0, x1, 64, ale, 0, STD_FULL_SCALE, GREEN, "aleatoric", f"{ale:.3f}")
        _bar(panel, x0, x1, 88, epi, 0, STD_FULL_SCALE, RED, "epistemic", f"{epi:.3f}")
    _bar(panel, x0, x1, 40, throttle, -1, 1, GREY, "throttle", f"{throttle:+.3f}")
    gated = " GATED: slow" if row.get("gated") else ""
    status = f"speed {row.get('speed_mph', 0):5.1f} mph  target {row.get('target_mph', 0):5.1f}{gated}"
    cv2.putText(panel, status, (6, 118), cv2.FONT_HERSHEY_SIMPLEX, 0.5, ORANGE if gated else WHITE, 1, cv2.LINE_AA)
    return np.concatenate([frame, panel], 0)


def has_display() -> bool:
    if os.environ.get("SDL_VIDEODRIVER", "") in ("dummy", "offscreen"):
        return False
    return sys.platform in ("win32", "darwin") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


class StopDriving(Exception):
    """The overlay window was closed."""


class Overlay:
    """Window (pygame) or video (mp4) of `draw`; `mode` is window, video or auto (window when a display exists)."""

    def __init__(self, mode: str, video_path: Path, fps: float = 15.0):
        self.mode = ("window" if has_display() else "video") if mode == "auto" else mode
        self.video_path, self.fps = video_path, fps
        self._video: VideoWriter | None = None
        self._screen: Any = None
        self.n_frames = 0

    def __call__(self, rec: StepRecord) -> None:
        img = draw(rec.obs["image"], rec)
        if self.mode == "video":
            if self._video is None:
                self._video = VideoWriter(self.video_path, fps=self.fps)
            self._video.write(img)
        else:
            import pygame

            if self._screen is None:
                pygame.display.init()
                self._screen = pygame.display.set_mode((img.shape[1], img.shape[0]))
                pygame.display.set_caption("drive udacity drive")
            self._screen.blit(pygame.surfarray.make_surface(img.swapaxes(0, 1)), (0, 0))
            pygame.display.flip()
            if any(e.type == pygame.QUIT for e in pygame.event.get()):
                raise StopDriving
        self.n_frames += 1

    def close(self) -> None:
        if self._video is not None:
            self._video.close()
            self._video = None
        if self._screen is not None:
            import pygame

            pygame.display.quit()
            self._screen = None
