"""`drive replay TRACE --out video.mp4`: an episode trace rendered with the uncertainty overlay
(drive/observe/replay.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

from drive.observe.overlay import FRAME_SIZE
from drive.observe.replay import replay
from drive.options import IntRange, PositiveInt


@dataclass(frozen=True)
class Config:
    trace: Annotated[Path, tyro.conf.Positional]
    """episode trace (trace_seedNNNNNN.parquet written by the recorder, e.g. `drive eval --trace DIR`)"""
    out: Path = Path("replay.mp4")
    """output video (mp4)"""
    fps: PositiveInt = 50
    """frames per second of the video (CarRacing runs at 50 steps/s)"""
    every: PositiveInt = 1
    """write every n-th step (2 halves the video length)"""
    frame_size: IntRange(16, 4096) = FRAME_SIZE
    """side of the upscaled driving frame in pixels"""


def run(cfg: Config) -> int:
    n = replay(cfg.trace, cfg.out, cfg.fps, cfg.every, cfg.frame_size)
    print(f"wrote {cfg.out} ({n} frames at {cfg.fps} fps)")
    return 0
