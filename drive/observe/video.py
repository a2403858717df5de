"""MP4 video: a writer over cv2.VideoWriter (fourcc mp4v, no ffmpeg binary needed), a reader for tests and checks.

Frames are RGB uint8 (H, W, 3) everywhere in this project; the BGR order cv2 wants stays inside this module. The
writer writes to a temporary file and renames it on close, so a killed run never leaves a truncated video under the
final name.
"""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np

from datasets.files import commit, temp_path
from drive.errors import UserError


class VideoError(UserError):
    """A video file cannot be opened, written or read; the message names the file."""


class VideoWriter:
    """`with VideoWriter("out.mp4", fps=50) as video: video.write(frame)`; the size is taken from the first frame."""

    def __init__(self, path: str | os.PathLike, fps: float = 50.0):
        self.path = Path(path)
        self.fps = float(fps)
        self.tmp = temp_path(self.path)
        self._writer: cv2.VideoWriter | None = None
        self._size: tuple[int, int] | None = None
        self.n_frames = 0

    def write(self, frame: np.ndarray) -> None:
        frame = np.asarray(frame)
        if frame.ndim == 2:
            frame = np.repeat(frame[..., None], 3, -1)
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise ValueError(f"{self.path}: frames must be (H, W, 3) uint8 RGB, got {frame.shape} {frame.dtype}")
        size = (frame.shape[1], frame.shape[0])
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = cv2.VideoWriter(str(self.tmp), cv2.VideoWriter.fourcc(*"mp4v"), self.fps, size)
            if not self._writer.isOpened():
                raise VideoError(f"{self.path}: cv2.VideoWriter could not open an mp4v stream of size {size}")
            self._size = size
        elif size != self._size:
            raise ValueError(f"{self.path}: frame size {size} differs from the first frame's {self._size}")
        self._writer.write(np.ascontiguousarray(frame[..., ::-1]))
        self.n_frames += 1

    def close(self) -> Path:
        if self._writer is None:
            raise VideoError(f"{self.path}: no frames were written")
        self._writer.release()
        self._writer = None
        commit(self.tmp, self.path)
        return self.path

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # leave no half-written video behind
            if self._writer is not None:
                self._writer.release()
            self.tmp.unlink(missing_ok=True)


def read_video(path: str | os.PathLike, max_frames: int | None = None) -> np.ndarray:
    """Decode a video into (N, H, W, 3) uint8 RGB."""
    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise VideoError(f"{path}: cannot open video")
    frames: list[np.ndarray] = []
    try:
        while max_frames is None or len(frames) < max_frames:
            ok, frame = cap.read()
            if not ok:
                break
            frames.append(frame[..., ::-1])
    finally:
        cap.release()
    if not frames:
        raise VideoError(f"{path}: no decodable frames")
    return np.stack(frames)


def video_fps(path: str | os.PathLike) -> float:
    cap = cv2.VideoCapture(str(path))
    try:
        if not cap.isOpened():
            raise VideoError(f"{path}: cannot open video")
        return float(cap.get(cv2.CAP_PROP_FPS))
    finally:
        cap.release()


def upscale(frame: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour upscale keeps the pixels crisp, (H, W, 3) -> (factor*H, factor*W, 3)."""
    return cv2.resize(frame, None, fx=factor, fy=factor, interpolation=cv2.INTER_NEAREST)


def put_lines(frame: np.ndarray, lines: list[str], scale: float = 0.45) -> np.ndarray:
    """Small white text on a translucent dark box in the top-left corner (drawn in place; returns the frame)."""
    font, step = cv2.FONT_HERSHEY_SIMPLEX, int(round(20 * scale / 0.45))
    width = max(cv2.getTextSize(line, font, scale, 1)[0][0] for line in lines) + 12
    height = step * len(lines) + 8
    box = frame[:height, :width]
    box[:] = (box * 0.35).astype(np.uint8)
    for i, line in enumerate(lines):
        cv2.putText(frame, line, (6, step * (i + 1)), font, scale, (255, 255, 255), 1, cv2.LINE_AA)
    return frame
