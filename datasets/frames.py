"""Frame coding of CarRacing pixels: the one place that turns a 96x96 RGB frame into what a controller sees.

`drive collect` stores frames coded by `code_frame`, `drive train` reads them, and the closed loop codes each live
frame with the same `ObservationCoder` before the controller sees it: training and driving can never code frames
differently, and each frame is coded once per step.

Codings (`FRAME_CODINGS`), each (96, 96, 3) uint8 RGB -> (84, 84) uint8 gray:
- `full` (the default): the whole view resized to 84x84 with area averaging, gray by ITU-R 601 weights (cv2's
  RGB2GRAY), the indicator bar kept: speed, ABS, steering and gyro bars, as every CarRacing pixel agent sees them.
  Why it is the default: the expert's gas and brake depend on speed; without the bar speed is only visible as
  motion between frames, and clones trained on cropped frames did not brake before corners (checkpoints/
  carracing_nsac.md).
- `cropped`: the bottom 12 rows (the indicator bar, the stock renderer's bottom 5/40 of the window) cut off, the
  84x96 road view resized to 84x84. What datasets recorded before codings existed hold (their manifests carry no
  `frame_coding`, which reads as `cropped`).

Input representations (`INPUTS`) of a stack of k coded frames, oldest first, (..., k, 84, 84) uint8:
- `frames`: the stack as is, one token per frame;
- `motion`: [newest frame, newest - previous, ..., second - oldest] (differences stored as 128 + diff / 2): an
  invertible re-coding that hands a per-frame CNN the motion directly.

Never imports `drive`, `agents` or `sim_bridges`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import cv2
import numpy as np
import torch

from datasets.area_gray import area_gray

FRAME_SIZE = 84
RAW_SHAPE = (96, 96, 3)
BAR_ROWS = 12  # the indicator bar at the bottom of CarRacing's 96x96 state pixels


def _check(rgb96: np.ndarray) -> np.ndarray:
    rgb96 = np.asarray(rgb96)
    if rgb96.shape != RAW_SHAPE or rgb96.dtype != np.uint8:
        raise ValueError(f"a CarRacing frame is {RAW_SHAPE} uint8 RGB, got {rgb96.shape} {rgb96.dtype}")
    return np.ascontiguousarray(rgb96)


def code_full(rgb96: np.ndarray) -> np.ndarray:
    """(96, 96, 3) uint8 RGB -> (84, 84) uint8 gray, the whole view including the indicator bar: cv2's INTER_AREA
    resize then RGB2GRAY, computed bit for bit by one numba kernel (datasets/area_gray.py: ~3x cv2's calls)."""
    return area_gray(_check(rgb96))


def code_cropped(rgb96: np.ndarray) -> np.ndarray:
    """(96, 96, 3) uint8 RGB -> (84, 84) uint8 gray of the road view, the indicator bar cropped."""
    road = _check(rgb96)[: RAW_SHAPE[0] - BAR_ROWS]  # (84, 96, 3)
    road = cv2.resize(road, (FRAME_SIZE, FRAME_SIZE), interpolation=cv2.INTER_AREA)  # (84, 84, 3)
    return cv2.cvtColor(road, cv2.COLOR_RGB2GRAY)


FRAME_CODINGS: Mapping[str, Callable[[np.ndarray], np.ndarray]] = {"full": code_full, "cropped": code_cropped}
DEFAULT_CODING = "full"
LEGACY_CODING = "cropped"  # what a manifest or fingerprint without `frame_coding` was recorded with


def fingerprint_coding(fingerprint: Mapping[str, Any]) -> str:
    """The frame coding a training-data fingerprint names. Fingerprints written before codings had this name say
    `frames: full | bridge` (`bridge`: the cropped frame the env used to produce); older ones nothing (cropped)."""
    if "frame_coding" in fingerprint:
        return str(fingerprint["frame_coding"])
    return {"full": "full", "bridge": "cropped"}.get(str(fingerprint.get("frames", "bridge")), LEGACY_CODING)


def frame_coder(name: str) -> Callable[[np.ndarray], np.ndarray]:
    if name not in FRAME_CODINGS:
        raise ValueError(f"unknown frame coding {name!r}; choose one of {sorted(FRAME_CODINGS)}")
    return FRAME_CODINGS[name]


def code_frames(raw: np.ndarray, coding: str) -> np.ndarray:
    """(T, 96, 96, 3) raw frames -> (T, 84, 84) coded frames."""
    code = frame_coder(coding)
    return np.stack([code(f) for f in raw]) if len(raw) else np.zeros((0, FRAME_SIZE, FRAME_SIZE), np.uint8)


def motion_stack(x: torch.Tensor) -> torch.Tensor:
    """(..., k, H, W) uint8 frame stack (oldest first) -> (..., k, H, W) uint8 [newest, newest - previous, ...]."""
    xi = x.to(torch.int16)
    diffs = xi[..., 1:, :, :] - xi[..., :-1, :, :]  # (..., k-1, H, W): f_{j+1} - f_j
    coded = (128 + torch.div(diffs.flip(-3), 2, rounding_mode="floor")).clamp(0, 255)  # newest difference first
    return torch.cat([xi[..., -1:, :, :], coded], dim=-3).to(torch.uint8)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


INPUTS: Mapping[str, Callable[[torch.Tensor], torch.Tensor]] = {"frames": _identity, "motion": motion_stack}


def input_transform(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The stack transform a controller expects (applied to uint8 tensors (..., k, 84, 84))."""
    if name not in INPUTS:
        raise ValueError(f"unknown input representation {name!r}; choose one of {sorted(INPUTS)}")
    return INPUTS[name]


class ObservationCoder:
    """Live frames -> the controller's input, built exactly as its training stacks were.

    Each raw frame is coded once (`coding`), kept in a sliding window of k (filled with the first frame after
    reset, as the recorded episodes pad their first stack), then the `input` transform is applied.
    """

    def __init__(self, coding: str = DEFAULT_CODING, input: str = "frames", k: int = 4):
        if k < 1:
            raise ValueError(f"a frame stack holds at least one frame, got k={k}")
        self.coding, self.input, self.k = coding, input, int(k)
        self._code, self._transform = frame_coder(coding), input_transform(input)
        self.reset()

    @classmethod
    def from_fingerprint(cls, fingerprint: Mapping[str, Any], k: int) -> ObservationCoder:
        """The coder of a checkpoint trained on demonstrations (its data fingerprint names coding and input)."""
        return cls(fingerprint_coding(fingerprint), str(fingerprint.get("input", "frames")), k)

    def reset(self) -> None:
        self._window: list[np.ndarray] | None = None  # the last k coded frames, oldest first
        self.last_frame: np.ndarray | None = None

    def __call__(self, rgb96: np.ndarray) -> torch.Tensor:
        """One raw (96, 96, 3) frame -> the controller input (1, k, 84, 84) uint8."""
        stack = np.empty((1, self.k, FRAME_SIZE, FRAME_SIZE), np.uint8)
        self.push_into(rgb96, stack[0])
        return self.transform(torch.from_numpy(stack))  # (1, k, 84, 84)

    def push_into(self, rgb96: np.ndarray, out: np.ndarray) -> None:
        """One raw (96, 96, 3) frame into the window, its k coded frames (oldest first) copied into `out` (k, 84, 84)
        uint8, before the input transform: what many cars' one controller call stacks (drive/loop/lanes.py), one
        slot per car, then transforms at once (`transform`: element by element, so the same as per car)."""
        frame = self._code(rgb96)  # (84, 84)
        if self._window is None:
            self._window = [frame] * self.k
        else:
            self._window.pop(0)
            self._window.append(frame)
        self.last_frame = frame
        for slot, coded in zip(out, self._window, strict=True):
            slot[...] = coded

    def transform(self, stacks: torch.Tensor) -> torch.Tensor:
        """(..., k, 84, 84) uint8 stacks -> the controller input: the `input` representation."""
        return self._transform(stacks)
