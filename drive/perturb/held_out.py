"""The held-out camera families: frame functions `(frame, level, rng) -> frame` on the raw (96, 96, 3) uint8 RGB
CarRacing frame, the same signature a user's plug-in has (drive/perturb/registry.py), so each one is also a worked
example of that protocol. drive/perturb/camera.py names them as kinds, checks their levels and seeds `rng` per episode.

No training surrogate draws from these families (NSAC's is additive Gaussian noise and a gain/offset): they are what
a benchmark reports as held out. Each has a severity that grows with its level and leaves the frame unchanged at
level 0; all are vectorised (numpy / one OpenCV call per frame). Only `rain` uses `rng`, fresh every frame.

- `motion_blur`: a horizontal motion-blur kernel `level` pixels long, [0, 95] (a box filter; a fractional length
  gives its two end taps the fraction, so the blur grows continuously; <= 1: unchanged);
- `fog`: contrast loss, the frame blended toward a uniform grey-white veil (215 on every channel) by the factor
  `level` in [0, 1) (1 would be the veil alone: a blank camera, not a shift);
- `darkness`: a gamma curve out = 255 (x / 255) ^ (1 / (1 - level)), level in [0, 1) (0.5: gamma 2; 0.75: gamma
  4): black and full white stay put, shadows and mid-tones sink (dusk with the exposure held on the highlights).
  Unlike `brightness`, which scales every pixel by one factor (and is inside NSAC's gain surrogate), the loss is
  non-linear in the pixel value;
- `jpeg`: JPEG compression at quality 100 - level, level an integer in [0, 99] so that a higher level is a stronger
  shift (99: quality 1); level 0 skips the codec (quality 100 still alters a few pixels);
- `rain`: `level` rain streaks per frame, an integer in [0, 1000]: thin bright lines 4-8 px long slanting down to
  the left, blended 60 % toward (210, 210, 220), drawn afresh every frame at uniformly random places;
- `hue`: hue rotation by `level` degrees in [0, 180] on HSV (the grey road keeps its colour; the green grass turns
  teal, blue at 90, magenta at 180, the largest rotation, hence the range; the red car turns orange, green, cyan).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import cv2
import numpy as np

FrameFn = Callable[[np.ndarray, float, np.random.Generator], np.ndarray]

VEIL = 215.0  # fog's grey-white, a little under white so the kerbs' white still stands out at light fog
RAIN_RGB = np.array([210.0, 210.0, 220.0], np.float32)
RAIN_ALPHA = 0.6
RAIN_SLANT = -0.35  # columns per row: the streaks lean 19 degrees off vertical
RAIN_LENGTHS = (4, 9)  # streak length in rows, drawn in [4, 9)


def motion_blur(frame: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    if level <= 1:
        return frame
    half = int(np.ceil(level / 2))
    offsets = np.arange(-half, half + 1, dtype=np.float32)
    taps = np.clip(level / 2 + 0.5 - np.abs(offsets), 0.0, 1.0)  # length-`level` box, fractional end taps
    kernel = (taps / taps.sum())[None, :]  # (1, 2 half + 1): horizontal
    return cv2.filter2D(frame, -1, kernel, borderType=cv2.BORDER_REFLECT)


def fog(frame: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    if level <= 0:
        return frame
    hazy = frame * np.float32(1 - level) + np.float32(level * VEIL)
    return np.clip(np.rint(hazy), 0, 255).astype(np.uint8)


def darkness(frame: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    if level <= 0:
        return frame
    table = np.rint(255.0 * (np.arange(256) / 255.0) ** (1.0 / (1.0 - level))).astype(np.uint8)
    return cv2.LUT(frame, table)


def jpeg(frame: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    if level <= 0:
        return frame
    quality = int(round(100 - level))
    ok, coded = cv2.imencode(".jpg", cv2.cvtColor(frame, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality])
    decoded = cv2.imdecode(coded, cv2.IMREAD_COLOR) if ok else None
    if decoded is None:  # pragma: no cover - OpenCV's JPEG codec does not fail on a valid uint8 image
        raise RuntimeError(f"OpenCV could not JPEG-code a frame at quality {quality}")
    return cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB)


def rain(frame: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    n = int(round(level))
    if n <= 0:
        return frame
    height, width = frame.shape[:2]
    low, high = RAIN_LENGTHS
    top = rng.integers(-high, height, n)  # streaks may enter from above the frame
    left = rng.integers(0, width + int(high * -RAIN_SLANT), n)  # ... or from its right edge, slanting left
    length = rng.integers(low, high, n)
    steps = np.arange(high)
    rows = top[:, None] + steps  # (n, high)
    cols = left[:, None] + np.rint(steps * RAIN_SLANT).astype(np.int64)
    keep = (steps < length[:, None]) & (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
    mask = np.zeros((height, width), bool)
    mask[rows[keep], cols[keep]] = True
    out = frame.copy()
    out[mask] = np.rint(frame[mask] * np.float32(1 - RAIN_ALPHA) + RAIN_ALPHA * RAIN_RGB).astype(np.uint8)
    return out


def hue(frame: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    if level <= 0:
        return frame
    hsv = cv2.cvtColor(frame.astype(np.float32) / 255.0, cv2.COLOR_RGB2HSV)  # float: H in [0, 360) degrees
    hsv[..., 0] = (hsv[..., 0] + np.float32(level)) % 360.0
    rgb = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
    return np.clip(np.rint(rgb * 255.0), 0, 255).astype(np.uint8)


class Family(NamedTuple):
    apply: FrameFn
    unit: str  # what the level means and its range, for messages and --help
    valid: Callable[[float], bool]


def _integer(low: int, high: int) -> Callable[[float], bool]:
    return lambda v: low <= v <= high and float(v).is_integer()


FAMILIES: dict[str, Family] = {
    "motion_blur": Family(motion_blur, "horizontal motion-blur length in pixels, [0, 95]", lambda v: 0 <= v <= 95),
    "fog": Family(fog, "blend toward a grey-white veil, factor in [0, 1)", lambda v: 0 <= v < 1),
    "darkness": Family(darkness, "gamma darkening, gamma = 1 / (1 - level), level in [0, 1)", lambda v: 0 <= v < 1),
    "jpeg": Family(jpeg, "JPEG at quality 100 - level, integer level in [0, 99]", _integer(0, 99)),
    "rain": Family(rain, "rain streaks per frame, integer in [0, 1000]", _integer(0, 1000)),
    "hue": Family(hue, "hue rotation in degrees, [0, 180]", lambda v: 0 <= v <= 180),
}
