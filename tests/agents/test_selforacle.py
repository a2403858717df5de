"""SelfOracle: a tiny VAE learns nominal frames, scores unfamiliar frames higher, and replays under a seed."""

from __future__ import annotations

import pytest
import torch

from agents.monitors.selforacle import SelfOracle, SelfOracleConfig

TINY = SelfOracleConfig(latent_dim=2, width=4)


def _road_frames(n: int, seed: int = 0) -> torch.Tensor:
    """(n, 84, 84) uint8: grey grass, a darker vertical road band at a random offset, like a coded CarRacing frame."""
    g = torch.Generator().manual_seed(seed)
    frames = torch.full((n, 84, 84), 150, dtype=torch.uint8)
    for i, left in enumerate(torch.randint(20, 44, (n,), generator=g).tolist()):
        frames[i, :, left : left + 20] = 90
    return frames


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # tiny convolutions on 2 shared cores: intra-op threads only add contention (as tests/conftest.py's one_thread)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def trained(one_thread) -> tuple[SelfOracle, list[float]]:
    model = SelfOracle(TINY)
    return model, model.fit(_road_frames(64), epochs=8, batch_size=16, lr=1e-2, seed=0)


def test_the_loss_falls(trained):
    model, history = trained
    untrained, frames, g = SelfOracle(TINY), _road_frames(64), torch.Generator  # the same seeded initial weights
    with torch.no_grad():
        before, after = (m.loss(frames, g().manual_seed(0)).item() for m in (untrained, model))
    assert after < 0.8 * before and history[-1] < history[1], (before, after, history)


def test_unfamiliar_frames_score_higher(trained):
    model, _ = trained
    frames = _road_frames(16, seed=1)
    nominal, inverted = model.score(frames), model.score(255 - frames)  # (B,) each
    assert nominal.shape == (16,) and bool((nominal >= 0).all())
    assert inverted.min() > nominal.max()


def test_a_frame_stack_is_scored_on_its_newest_frame(trained):
    model, _ = trained
    frames = _road_frames(4, seed=2)
    stack = torch.stack([255 - frames, frames], 1)  # (B, 2, 84, 84), newest last
    torch.testing.assert_close(model.score(stack), model.score(frames))
    with pytest.raises(ValueError, match="coded frames"):
        model.score(torch.zeros(2, 64, 64, dtype=torch.uint8))


def test_deterministic_given_the_seed_and_saved_exactly(trained, tmp_path):
    model, history = trained
    again = SelfOracle(TINY)
    assert again.fit(_road_frames(64), epochs=8, batch_size=16, lr=1e-2, seed=0) == history
    frames = _road_frames(8, seed=3)
    torch.testing.assert_close(again.score(frames), model.score(frames), rtol=0, atol=0)
    model.save(tmp_path / "selforacle.pt")
    loaded = SelfOracle.load(tmp_path / "selforacle.pt")
    assert loaded.cfg == TINY
    torch.testing.assert_close(loaded.score(frames), model.score(frames), rtol=0, atol=0)
