"""Frame coding: the one function training and driving share; the observation coder of the closed loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from datasets.frames import (
    ObservationCoder,
    code_cropped,
    code_frames,
    code_full,
    fingerprint_coding,
    input_transform,
    motion_stack,
)


def test_cropped_coding_drops_the_indicator_bar():
    rgb = np.zeros((96, 96, 3), np.uint8)
    rgb[84:] = 255  # the indicator bar rows
    assert code_cropped(rgb).max() == 0
    rgb[:84, :, 1] = 200  # pure green road view
    out = code_cropped(rgb)
    assert out.shape == (84, 84) and out.dtype == np.uint8
    assert np.all(out == round(0.587 * 200))  # ITU-R 601 luma of (0, 200, 0)


def test_full_coding_keeps_the_indicator_bar():
    rgb = np.zeros((96, 96, 3), np.uint8)
    rgb[84:] = 255
    out = code_full(rgb)
    assert out.shape == (84, 84) and out[-5:].min() == 255 and out[:60].max() == 0


def test_codings_refuse_frames_of_another_shape():
    for code in (code_full, code_cropped):
        with pytest.raises(ValueError, match="96, 96, 3"):
            code(np.zeros((84, 84, 3), np.uint8))


def test_observation_coder_stacks_like_the_recorded_episodes():
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (6, 96, 96, 3), dtype=np.uint8)
    coded = code_frames(raw, "full")  # (6, 84, 84)
    padded = np.concatenate([np.repeat(coded[:1], 3, axis=0), coded])  # what the recorder stores, k = 4
    coder = ObservationCoder("full", "frames", 4)
    for t in range(6):
        x = coder(raw[t])
        assert x.shape == (1, 4, 84, 84) and x.dtype == torch.uint8
        np.testing.assert_array_equal(x[0].numpy(), padded[t : t + 4])
        np.testing.assert_array_equal(coder.last_frame, coded[t])
    coder.reset()
    np.testing.assert_array_equal(coder(raw[5])[0].numpy(), np.repeat(coded[5:6], 4, axis=0))


def test_motion_input_is_invertible_to_the_frames():
    x = torch.randint(0, 256, (2, 4, 8, 8), dtype=torch.uint8)
    m = motion_stack(x)
    assert torch.equal(m[:, 0], x[:, -1])
    diff = x[:, 3].to(torch.int16) - x[:, 2].to(torch.int16)
    assert torch.equal(m[:, 1].to(torch.int16), (128 + torch.div(diff, 2, rounding_mode="floor")).clamp(0, 255))
    assert input_transform("frames")(x) is x
    with pytest.raises(ValueError, match="input representation"):
        input_transform("optical-flow")


def test_fingerprints_of_every_age_name_their_coding():
    assert fingerprint_coding({"frame_coding": "cropped"}) == "cropped"
    assert fingerprint_coding({"frames": "full"}) == "full"  # before codings had this name
    assert fingerprint_coding({"frames": "bridge"}) == "cropped"
    assert fingerprint_coding({}) == "cropped"  # before frame options existed: the env's cropped stack
