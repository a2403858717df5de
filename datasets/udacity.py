"""Udacity simulator logs: loader, the frame preprocessing shared by training and driving, augmentation.

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

`augment` reproduces naokishibuya's training augmentation (applied to a sample with probability 0.6, as their batch
generator does): random camera (left +0.2, right -0.2), horizontal flip (steering negated), random translate
(steering += dx * 0.002), random shadow, random brightness. Every draw comes from the numpy Generator passed in, so it
is deterministic under a seed. Departures: the shadow line spans the frame being augmented (theirs uses the 200x66
output size on 320x160 frames), and brightness is clipped to [0, 255] (theirs wraps around in uint8).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
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
        raise UdacityLogError(f"{log.path}:{int(log.line[i])}: {camera} image {Path(path).name!r}: "
                              f"{str(exc).split(': ', 1)[-1]}") from None  # fmt: skip


def preprocess(rgb: np.ndarray) -> np.ndarray:
    """(160, 320, 3) uint8 RGB -> (3, 66, 200) uint8 YUV: crop rows 60:-25, resize to 200x66, RGB->YUV."""
    if not isinstance(rgb, np.ndarray) or rgb.shape != FRAME_SHAPE or rgb.dtype != np.uint8:
        got = (getattr(rgb, "shape", None), getattr(rgb, "dtype", type(rgb).__name__))
        raise ValueError(f"preprocess expects a (160, 320, 3) uint8 RGB frame, got shape/dtype {got}")
    crop = rgb[CROP_TOP : FRAME_SHAPE[0] - CROP_BOTTOM]  # (75, 320, 3)
    small = cv2.resize(crop, (MODEL_SHAPE[2], MODEL_SHAPE[1]), interpolation=cv2.INTER_LINEAR)  # (66, 200, 3)
    yuv = cv2.cvtColor(small, cv2.COLOR_RGB2YUV)  # (66, 200, 3)
    return np.ascontiguousarray(yuv.transpose(2, 0, 1))  # (3, 66, 200)


# -- augmentation (training only) --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AugmentConfig:
    p_augment: float = 0.6
    """probability that a training sample is augmented (otherwise: center camera as recorded)"""
    correction: float = STEERING_CORRECTION
    """steering added for the left camera, subtracted for the right"""
    range_x: float = 100.0
    """horizontal translation range in pixels: dx ~ U(-range_x/2, range_x/2)"""
    range_y: float = 10.0
    """vertical translation range in pixels: dy ~ U(-range_y/2, range_y/2)"""
    translate_gain: float = 0.002
    """steering added per pixel of horizontal translation"""
    shadow_min: float = 0.2
    """darkest shadow: lightness multiplied by U(shadow_min, shadow_max)"""
    shadow_max: float = 0.5
    """lightest shadow"""
    brightness: float = 0.4
    """brightness (HSV value) multiplied by 1 + brightness * U(-0.5, 0.5)"""


Frame = np.ndarray | Callable[[], np.ndarray]  # an RGB frame, or a loader called only if that frame is used


def _resolve(frame: Frame) -> np.ndarray:
    return frame() if callable(frame) else frame


def choose_camera(
    frames: Sequence[Frame | None], steering: float, rng: np.random.Generator, correction: float
) -> tuple[np.ndarray, float]:
    """Uniform over the cameras present (center, left, right); side cameras get the steering correction."""
    present = [i for i, frame in enumerate(frames) if frame is not None]
    choice = present[rng.integers(len(present))]
    return _resolve(frames[choice]), steering + (0.0, correction, -correction)[choice]


def random_flip(rgb: np.ndarray, steering: float, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    if rng.random() < 0.5:
        return np.ascontiguousarray(rgb[:, ::-1]), -steering
    return rgb, steering


def translate(rgb: np.ndarray, dx: float, dy: float) -> np.ndarray:
    """Shift by (dx, dy) pixels, uncovered border black (cv2.warpAffine default)."""
    shift = np.float32([[1, 0, dx], [0, 1, dy]])
    return cv2.warpAffine(rgb, shift, (rgb.shape[1], rgb.shape[0]))


def random_translate(
    rgb: np.ndarray, steering: float, rng: np.random.Generator, cfg: AugmentConfig
) -> tuple[np.ndarray, float]:
    dx = cfg.range_x * (rng.random() - 0.5)
    dy = cfg.range_y * (rng.random() - 0.5)
    return translate(rgb, dx, dy), steering + dx * cfg.translate_gain


def random_shadow(rgb: np.ndarray, rng: np.random.Generator, cfg: AugmentConfig) -> np.ndarray:
    """Darken (HLS lightness) one side of a random line from the top edge to the bottom edge."""
    height, width = rgb.shape[:2]
    x1, x2 = width * rng.random(), width * rng.random()  # the line runs from (x1, 0) to (x2, height)
    xs, ys = np.arange(width, dtype=np.float32), np.arange(height, dtype=np.float32)[:, None]
    side = (xs - x1) * height - ys * (x2 - x1) > 0  # (H, W): sign of the cross product = side of the line
    shaded = side == bool(rng.integers(2))
    ratio = rng.uniform(cfg.shadow_min, cfg.shadow_max)
    hls = cv2.cvtColor(rgb, cv2.COLOR_RGB2HLS)
    lightness = hls[..., 1]
    hls[..., 1] = np.where(shaded, (lightness * ratio).astype(np.uint8), lightness)
    return cv2.cvtColor(hls, cv2.COLOR_HLS2RGB)


def random_brightness(rgb: np.ndarray, rng: np.random.Generator, cfg: AugmentConfig) -> np.ndarray:
    ratio = 1.0 + cfg.brightness * (rng.random() - 0.5)
    hsv = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)
    hsv[..., 2] = np.clip(hsv[..., 2] * ratio, 0, 255).astype(np.uint8)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


def augment(
    frames: Sequence[Frame | None], steering: float, rng: np.random.Generator, cfg: AugmentConfig = AugmentConfig()
) -> tuple[np.ndarray, float]:
    """(center, left, right) RGB frames (side ones may be None) + steering -> one augmented RGB frame + its steering.

    A frame may be given as a zero-argument loader: only the camera actually used is then decoded.
    With probability 1 - p_augment the center frame and steering come back unchanged (naokishibuya's batch generator).
    """
    if frames[0] is None:
        raise ValueError("augment needs the center frame")
    if rng.random() >= cfg.p_augment:
        return _resolve(frames[0]), float(steering)
    rgb, steering = choose_camera(frames, steering, rng, cfg.correction)
    rgb, steering = random_flip(rgb, steering, rng)
    rgb, steering = random_translate(rgb, steering, rng, cfg)
    rgb = random_shadow(rgb, rng, cfg)
    rgb = random_brightness(rgb, rng, cfg)
    return rgb, float(steering)
