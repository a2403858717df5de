"""The `full` coding's kernel equals OpenCV's resize + RGB2GRAY bit for bit (datasets/area_gray.py)."""

from __future__ import annotations

import cv2
import numpy as np

from datasets.area_gray import GRAY_B, GRAY_G, GRAY_R, GRAY_SHIFT, area_gray
from datasets.frames import code_full
from drive.loop.envs import make_env


def cv2_full(rgb96: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(cv2.resize(rgb96, (84, 84), interpolation=cv2.INTER_AREA), cv2.COLOR_RGB2GRAY)


def test_equals_cv2_on_random_and_palette_frames():
    rng = np.random.default_rng(0)
    for i in range(400):
        if i % 2:
            rgb = rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)
        else:  # few colours in blocks, like rendered frames: exact ties in the area sums
            rgb = (rng.integers(0, 4, (96, 96, 3)) * 85).astype(np.uint8)
        assert np.array_equal(area_gray(rgb), cv2_full(rgb)), i


def test_equals_cv2_on_carracing_frames():
    env = make_env("carracing", max_episode_steps=200)
    rng = np.random.default_rng(1)
    obs, _ = env.reset(seed=3)
    frames = [obs]
    for _ in range(150):
        obs, *_ = env.step(np.array([rng.uniform(-1, 1), 0.6, 0.0], np.float32))
        frames.append(obs)
    env.close()
    for t, rgb in enumerate(frames):
        assert np.array_equal(code_full(rgb), cv2_full(np.ascontiguousarray(rgb))), t


def test_gray_weights_equal_cv2_on_every_colour():
    c = np.arange(1 << 24, dtype=np.uint32)
    rgb = np.stack([(c >> 16) & 255, (c >> 8) & 255, c & 255], -1).astype(np.uint8).reshape(4096, 4096, 3)
    r, g, b = (rgb[..., i].astype(np.int64) for i in range(3))
    ours = (r * GRAY_R + g * GRAY_G + b * GRAY_B + (1 << (GRAY_SHIFT - 1))) >> GRAY_SHIFT
    assert np.array_equal(ours, cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY))
