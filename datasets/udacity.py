"""Udacity simulator logs: loader and the frame preprocessing shared by training and driving.

Log variants read (all seen in the wild, see ../shared/data/udacity_sim/PROVENANCE.md):
- the simulator's own: no header, absolute Windows paths, fields separated by ", ";
- Udacity's official sample data.zip: header `center,left,right,steering,throttle,brake,speed`, relative `IMG/...`;
- Linux/macOS builds: absolute POSIX paths, no spaces, speeds like `1.600606E-05`.
Images are found by basename in `IMG/` beside the log, whatever path the recording machine wrote. Side cameras may be
empty (a log recorded in autonomous mode carries only the center frame). Any malformed row, non-finite number,
steering outside [-1, 1] or missing image raises `UdacityLogError` naming the file and line (`skip_bad=True`: rows
naming a missing image are left out and listed in `UdacityLog.skipped`); `load_row_frame` names the row of a corrupt
image.

`preprocess` is the NSAC / car-behavioral-cloning (naokishibuya) pipeline: crop sky and hood (rows 60:-25), resize to
200x66, RGB -> YUV, channels first. `drive udacity drive` (drive/loop/udacity.py) calls this very function on live
frames, so training
and driving can never preprocess differently. Departure: naokishibuya passes `cv2.INTER_AREA` as the third
*positional* argument of cv2.resize, which is `dst`, so their resize is in fact bilinear; we use bilinear explicitly.

Training augmentation: datasets/udacity_augment.py.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from datasets.errors import DataError

FIELDS = ("center", "left", "right", "steering", "throttle", "brake", "speed")
CAMERAS = ("center", "left", "right")
FRAME_SHAPE = (160, 320, 3)  # what the simulator's cameras write: 320x160 RGB
MODEL_SHAPE = (3, 66, 200)  # YUV, channels first: the NVIDIA PilotNet input
CROP_TOP, CROP_BOTTOM = 60, 25  # sky and hood rows dropped (naokishibuya utils.crop: image[60:-25])
STEERING_CORRECTION = 0.2  # left camera sees the car as if it were left of centre: steer right (+0.2)


class UdacityLogError(DataError):
    """A driving_log.csv row, or an image it names, that cannot be used. The message names the file and line."""


@dataclass(frozen=True)
class UdacityLog:
    """A parsed log: one entry per row, in recording (time) order. Paths are resolved inside `IMG/` beside the log."""

    path: Path
    center: tuple[Path, ...]
    left: tuple[Path | None, ...]
    right: tuple[Path | None, ...]
    steering: np.ndarray  # (N,) float64, normalised to [-1, 1]
    throttle: np.ndarray  # (N,)
    brake: np.ndarray  # (N,)
    speed: np.ndarray  # (N,) mph
    line: np.ndarray  # (N,) 1-based line number of each row in the file, for error messages
    skipped: tuple[str, ...] = ()  # read with skip_bad=True: one message per row left out (naming its line)

    def __len__(self) -> int:
        return len(self.center)

    def cameras(self, i: int) -> tuple[Path, Path | None, Path | None]:
        return self.center[i], self.left[i], self.right[i]


def _basename(field: str) -> str:
    # Split on both separators: a Windows path read on Linux is one long name to pathlib.
    return re.split(r"[\\/]", field)[-1]


def _index_images(img_dir: Path) -> dict[str, Path]:
    try:
        return {entry.name: Path(entry.path) for entry in os.scandir(img_dir) if entry.is_file()}
    except FileNotFoundError:
        return {}


def read_log(path: str | os.PathLike, skip_bad: bool = False) -> UdacityLog:
    """Read `driving_log.csv` (or a directory holding it) in any of the variants above; validate every row and image.

    skip_bad: a row naming a missing image is left out and its message kept in `skipped` instead of raising."""
    path = Path(path)
    if path.is_dir():
        path = path / "driving_log.csv"
    if not path.is_file():
        raise UdacityLogError(f"{path}: no such driving log")
    img_dir = path.parent / "IMG"
    images = _index_images(img_dir)
    paths: dict[str, list] = {cam: [] for cam in CAMERAS}
    numbers: dict[str, list[float]] = {name: [] for name in FIELDS[3:]}
    lines: list[int] = []
    skipped: list[str] = []
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
        for n, raw in enumerate(f, start=1):
            text = raw.strip().lstrip("\ufeff")
            if not text:
                continue
            fields = [field.strip() for field in text.split(",")]
            if n == 1 and fields[0].lower() == "center":
                if [field.lower() for field in fields] != list(FIELDS):
                    raise UdacityLogError(f"{path}:{n}: header {fields} is not {list(FIELDS)}")
                continue
            if len(fields) != len(FIELDS):
                raise UdacityLogError(
                    f"{path}:{n}: expected {len(FIELDS)} fields ({', '.join(FIELDS)}), got {len(fields)}"
                )
            try:
                row_paths = _row_images(fields, images, f"{path}:{n}", img_dir)
            except UdacityLogError as exc:
                if not skip_bad:
                    raise
                skipped.append(str(exc))
                continue
            for cam, image in zip(CAMERAS, row_paths, strict=True):
                paths[cam].append(image)
            for name, value in _row_numbers(fields, f"{path}:{n}").items():
                numbers[name].append(value)
            lines.append(n)
    if not lines:
        raise UdacityLogError(
            f"{path}: no data rows" + (f" ({len(skipped)} skipped; first: {skipped[0]})" if skipped else "")
        )
    return UdacityLog(
        path=path,
        center=tuple(paths["center"]),
        left=tuple(paths["left"]),
        right=tuple(paths["right"]),
        **{name: np.asarray(values, dtype=np.float64) for name, values in numbers.items()},
        line=np.asarray(lines),
        skipped=tuple(skipped),
    )


def _row_numbers(fields: list[str], where: str) -> dict[str, float]:
    out = {}
    for name, field in zip(FIELDS[3:], fields[3:], strict=True):
        try:
            value = float(field)
        except ValueError:
            raise UdacityLogError(f"{where}: field {name!r} is not a number: {field!r}") from None
        if not math.isfinite(value):
            raise UdacityLogError(f"{where}: field {name!r} is not finite: {field!r}")
        out[name] = value
    if abs(out["steering"]) > 1.0 + 1e-6:
        raise UdacityLogError(f"{where}: steering {out['steering']} outside [-1, 1] (degrees instead of normalised?)")
    return out


def _row_images(fields: list[str], images: dict[str, Path], where: str, img_dir: Path) -> list[Path | None]:
    out: list[Path | None] = []
    for cam, field in zip(CAMERAS, fields[:3], strict=True):
        name = _basename(field)
        if not name:
            if cam == "center":
                raise UdacityLogError(f"{where}: empty center image path")
            out.append(None)
        elif name not in images:
            raise UdacityLogError(f"{where}: {cam} image {name!r} not found in {img_dir}")
        else:
            out.append(images[name])
    return out


# -- frames ------------------------------------------------------------------------------------------------------------
def decode_frame(data: bytes, source: str | os.PathLike = "<bytes>") -> np.ndarray:
    """JPEG/PNG bytes -> (160, 320, 3) uint8 RGB; a corrupt file or a wrong size raises naming `source`."""
    bgr = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if bgr is None:
        raise UdacityLogError(f"{source}: not a decodable image ({len(data)} bytes)")
    if bgr.shape != FRAME_SHAPE:
        raise UdacityLogError(f"{source}: image is {bgr.shape[1]}x{bgr.shape[0]}, expected 320x160")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def load_frame(path: str | os.PathLike) -> np.ndarray:
    """Read one camera image -> (160, 320, 3) uint8 RGB."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UdacityLogError(f"{path}: cannot read image ({exc.strerror})") from exc
    return decode_frame(data, path)


def load_row_frame(log: UdacityLog, i: int, camera: str = "center") -> np.ndarray:
    """The RGB frame of row i's camera; an unreadable or corrupt image raises naming the log's file and line."""
    path = getattr(log, camera)[i]
    try:
        return load_frame(path)
    except UdacityLogError as exc:
        raise UdacityLogError(
            f"{log.path}:{int(log.line[i])}: {camera} image {Path(path).name!r}: {str(exc).split(': ', 1)[-1]}"
        ) from None


def preprocess(rgb: np.ndarray) -> np.ndarray:
    """(160, 320, 3) uint8 RGB -> (3, 66, 200) uint8 YUV: crop rows 60:-25, resize to 200x66, RGB->YUV."""
    if not isinstance(rgb, np.ndarray) or rgb.shape != FRAME_SHAPE or rgb.dtype != np.uint8:
        got = (getattr(rgb, "shape", None), getattr(rgb, "dtype", type(rgb).__name__))
        raise ValueError(f"preprocess expects a (160, 320, 3) uint8 RGB frame, got shape/dtype {got}")
    crop = rgb[CROP_TOP : FRAME_SHAPE[0] - CROP_BOTTOM]  # (75, 320, 3)
    small = cv2.resize(crop, (MODEL_SHAPE[2], MODEL_SHAPE[1]), interpolation=cv2.INTER_LINEAR)  # (66, 200, 3)
    yuv = cv2.cvtColor(small, cv2.COLOR_RGB2YUV)  # (66, 200, 3)
    return np.ascontiguousarray(yuv.transpose(2, 0, 1))  # (3, 66, 200)
