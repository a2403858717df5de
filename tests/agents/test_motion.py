"""Phase correlation: it recovers known shifts (integer and sub-pixel, either sign), agrees with OpenCV's on real
Udacity frames, and the multi-frame `nvidia` encoder feeds it to its first convolution."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from agents.encoders import EncoderConfig, NvidiaTokens, build_encoder
from agents.layers.motion import phase_shift
from datasets.udacity import load_frame, preprocess, read_log
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "udacity"


def _texture(seed=0, h=66, w=200):
    rng = np.random.default_rng(seed)
    return cv2.GaussianBlur(rng.random((h, w)), (0, 0), 1.0)


def _fourier_shift(a: np.ndarray, dx: float, dy: float) -> np.ndarray:
    """a moved by (dx, dy) pixels, periodically and exactly (the shift theorem), sub-pixel included."""
    fy, fx = np.fft.fftfreq(a.shape[0])[:, None], np.fft.fftfreq(a.shape[1])[None, :]
    return np.fft.ifft2(np.fft.fft2(a) * np.exp(-2j * np.pi * (fx * dx + fy * dy))).real


@pytest.mark.parametrize("dx, dy", [(3.0, 0.0), (-5.0, 2.0), (1.5, -0.5), (-0.3, 0.0)])
def test_recovers_a_known_shift(dx, dy):
    a = preprocess(load_frame(read_log(FIXTURES / "header_relative.csv").center[0]))[0].astype(np.float64)
    for image in (a, _texture()):
        b = _fourier_shift(image, dx, dy)
        got = phase_shift(torch.from_numpy(image[None]), torch.from_numpy(b[None]))[0].numpy()
        assert got == pytest.approx([dx, dy], abs=0.25)


def test_agrees_with_opencv_on_real_frames():
    log = read_log(FIXTURES / "header_relative.csv")
    ys = np.stack([preprocess(load_frame(p))[0] for p in log.center]).astype(np.float64)  # (3, 66, 200)
    got = phase_shift(torch.from_numpy(ys[:-1]), torch.from_numpy(ys[1:])).numpy()
    ref = np.array([cv2.phaseCorrelate(ys[i], ys[i + 1])[0] for i in range(len(ys) - 1)])
    assert np.abs(got - ref).max() < 0.5


def test_the_multi_frame_encoder_sees_the_shift():
    """Two stacks with the same current frame and difference images but different measured shifts... are not
    constructible; instead: the shift planes enter the first convolution (its input width), and moving the previous
    frame changes the encoding even where the current frame is fixed."""
    assert NvidiaTokens.channels(1) == 3 and NvidiaTokens.channels(2) == 8 and NvidiaTokens.channels(3) == 13
    torch.manual_seed(0)
    enc = build_encoder(EncoderConfig(kind="nvidia", in_dim=2, d_model=8))
    assert enc.cnn[0].in_channels == 8
    cur = (np.stack([_texture(1)] * 3) * 255).astype(np.uint8)  # (3, 66, 200)
    shifted = np.roll(cur, 2, axis=2)
    x = torch.from_numpy(np.stack([np.concatenate([cur, cur]), np.concatenate([shifted, cur])]))  # (2, 6, 66, 200)
    out = enc(x)
    assert out.shape == (2, 18, 8) and not torch.allclose(out[0], out[1])
