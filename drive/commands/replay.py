"""`drive replay TRACE --out video.mp4`: an episode trace rendered with the uncertainty overlay
(drive/observe/replay.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import tyro

from drive.errors import UserError
from drive.observe import FRAME_SIZE
from drive.options import IntRange, PositiveInt, writable_file

FrameSize: Any = IntRange(16, 4096)  # an option type (a range-checked int), like drive.options.PositiveInt


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
    frame_size: FrameSize = FRAME_SIZE
    """side of the upscaled driving frame in pixels"""


def check_before_running(cfg: Config) -> None:
    """A trace folder (what `drive eval --trace DIR` names) points to its files; the video's path must be writable."""
    if cfg.trace.is_dir():
        found = sorted(cfg.trace.glob("trace_*.parquet"))
        if not found:
            raise UserError(
                f"{cfg.trace} is a folder without trace files (trace_seedNNNNNN.parquet, written by "
                "`drive eval --trace DIR`); give one trace file"
            )
        raise UserError(f"{cfg.trace} is a folder; give one of its {len(found)} trace files, e.g. {found[0]}")
    writable_file(cfg.out, "--out")


def run(cfg: Config) -> int:
    from drive.observe.replay import replay  # pyarrow and the renderer: not for `--help`

    check_before_running(cfg)
    n = replay(cfg.trace, cfg.out, cfg.fps, cfg.every, cfg.frame_size)
    print(f"wrote {cfg.out} ({n} frames at {cfg.fps} fps)")
    return 0
