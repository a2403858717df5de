"""Training augmentation of Udacity frames (naokishibuya's car-behavioral-cloning), on top of datasets/udacity.py.

`augment` reproduces naokishibuya's training augmentation (applied to a sample with probability 0.6, as their batch
generator does): random camera (left +0.2, right -0.2), horizontal flip (steering negated), random translate
(steering += dx * 0.002), random shadow, random brightness. Every draw comes from the numpy Generator passed in, so it
is deterministic under a seed. Departures: the shadow line spans the frame being augmented (theirs uses the 200x66
output size on 320x160 frames), and brightness is clipped to [0, 255] (theirs wraps around in uint8).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from datasets.udacity import STEERING_CORRECTION


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
