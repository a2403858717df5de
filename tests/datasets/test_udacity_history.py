"""Frame history: stacks never cross a gap in time, the live stacker matches the offline one frame for frame, and a
multi-frame controller's training sample gets one set of augmentation draws for its whole stack."""

from __future__ import annotations

import numpy as np
import pytest

from datasets.udacity_history import FrameHistory, history_rows, stack_history


def test_rows_are_the_previous_frames_of_the_segment_oldest_first():
    t = np.array([0.0, 0.1, 0.2, 5.0, 5.1, 5.2, 5.3])  # a 4.8 s gap after row 2
    rows = history_rows(t, 3, max_gap_s=1.0)
    assert rows.tolist() == [[0, 0, 0], [0, 0, 1], [0, 1, 2], [3, 3, 3], [3, 3, 4], [3, 4, 5], [4, 5, 6]]
    assert history_rows(t, 1).tolist() == [[i] for i in range(7)]
    with pytest.raises(ValueError):
        history_rows(t, 0)


def test_stack_puts_the_current_frame_last_and_live_stacking_matches_offline():
    frames = np.arange(5 * 3 * 2 * 2, dtype=np.uint8).reshape(5, 3, 2, 2)  # (N, 3, H, W)
    t = np.array([0.0, 0.1, 0.2, 9.0, 9.1])
    offline = stack_history(frames, history_rows(t, 2))  # (5, 6, 2, 2)
    assert offline.shape == (5, 6, 2, 2)
    assert (offline[2, 3:] == frames[2]).all() and (offline[2, :3] == frames[1]).all()
    live, got = FrameHistory(2), []
    for i in range(5):
        if i == 3:
            live.reset()  # a new connection / a pause: what a segment start is offline
        got.append(live.push(frames[i]))
    assert all((g == o).all() for g, o in zip(got, offline, strict=True))


def test_a_two_frame_training_sample_is_augmented_alike_on_both_frames(tmp_path):
    """Same draws for the stack: the label's shift correction and flip are one decision, so the current frame of a
    two-frame sample equals the one-frame sample of the same (seed, epoch, row)."""
    from drive.learn.tasks.udacity import Options, UdacityFrames, _read
    from tests.conftest import REPO

    path = REPO / "tests" / "fixtures" / "udacity" / "header_relative.csv"
    one = _read(Options(frames=1, max_gap_s=10.0), path)
    two = _read(Options(frames=2, max_gap_s=10.0), path)
    from datasets.udacity_augment import AugmentConfig

    index = np.array([[0, 1], [0, 2]])
    a = UdacityFrames([one], index, AugmentConfig(p_augment=1.0), seed=3)
    b = UdacityFrames([two], index, AugmentConfig(p_augment=1.0), seed=3)
    for i in range(2):
        (x1, y1), (x2, y2) = a[i], b[i]
        assert x2.shape == (6, 66, 200) and float(y1) == float(y2)
        assert (x2[3:] == x1).all()
    val = UdacityFrames([two], index)  # not augmented: the recorded frames, previous one first
    x, _ = val[1]
    assert (x[3:] == UdacityFrames([one], index)[1][0]).all() and (x[:3] == UdacityFrames([one], index)[0][0]).all()


def test_the_bridge_policy_stacks_live_frames_as_training_did(monkeypatch):
    """SteeringPolicy with a two-frame controller: the first frame after a reset is stacked with itself, then each
    frame with its predecessor — the segment start and the pairs the training stacks hold."""
    import torch

    from agents.encoders import EncoderConfig
    from agents.registry import CONTROLLERS
    from datasets.udacity import preprocess
    from drive.loop.udacity import SpeedConfig, SpeedController, SteeringPolicy

    model = CONTROLLERS["gmle"](encoder=EncoderConfig(kind="nvidia", in_dim=2, d_model=8)).build().eval()
    seen = []
    real = model.predict
    monkeypatch.setattr(model, "predict", lambda x, *a: seen.append(x.clone()) or real(x, *a))
    policy = SteeringPolicy(model, 1, 0, SpeedController(SpeedConfig()))
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (160, 320, 3), dtype=np.uint8) for _ in range(3)]
    policy.reset()
    for f in frames[:2]:
        policy.predict(f)
    policy.reset()
    policy.predict(frames[2])
    p = [torch.from_numpy(preprocess(f)) for f in frames]
    assert [tuple(x.shape) for x in seen] == [(1, 6, 66, 200)] * 3
    assert torch.equal(seen[0][0], torch.cat([p[0], p[0]])) and torch.equal(seen[1][0], torch.cat([p[0], p[1]]))
    assert torch.equal(seen[2][0], torch.cat([p[2], p[2]]))
