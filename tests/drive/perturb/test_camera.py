"""The held-out camera families (drive/perturb/held_out.py) as kinds of drive/perturb/camera.py: identity at level 0,
severity growing with the level on a real CarRacing frame, per-episode determinism, their stated definitions,
range errors, and the check on what a frame function returns."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from drive.perturb.camera import FramePerturber, FunctionPerturber, Perturbation, check_frame, parse_perturbation
from drive.perturb.held_out import FAMILIES, VEIL

#: kind -> levels of growing severity (the first the identity)
LADDERS = {
    "motion_blur": (0, 2, 4, 8, 16),
    "fog": (0, 0.2, 0.4, 0.6, 0.9),
    "darkness": (0, 0.2, 0.4, 0.6, 0.9),
    "jpeg": (0, 60, 85, 95, 99),
    "rain": (0, 10, 50, 200, 800),
    "hue": (0, 20, 60, 120, 180),
}


@pytest.fixture(scope="module")
def frame() -> np.ndarray:
    """A raw frame of a real CarRacing episode (track 1000, 60 steps in: road, grass, kerbs, car, indicator bar)."""
    from sim_bridges.carracing.bridge import make_carracing

    env = make_carracing()
    try:
        obs, _ = env.reset(seed=1000)
        for _ in range(60):
            obs, *_ = env.step(np.array([0.0, 0.3, 0.0], np.float32))
    finally:
        env.close()
    return obs


def _apply(kind: str, level: float, frame: np.ndarray, episode: int = 3) -> np.ndarray:
    perturber = FramePerturber(Perturbation(kind, level), seed=1)
    perturber.reset(episode)
    return perturber(frame)


def test_every_new_family_is_a_kind_with_a_ladder():
    assert set(LADDERS) == set(FAMILIES)


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_level_zero_leaves_the_frame_unchanged(kind, frame):
    assert np.array_equal(_apply(kind, 0, frame), frame)


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_severity_grows_with_the_level_on_a_real_frame(kind, frame):
    diffs = [np.abs(_apply(kind, level, frame).astype(int) - frame).mean() for level in LADDERS[kind]]
    assert diffs[0] == 0 and all(b > a for a, b in zip(diffs, diffs[1:], strict=False)), (kind, diffs)


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_same_episode_seed_same_frames(kind, frame):
    level = LADDERS[kind][2]
    perturber = FramePerturber(Perturbation(kind, level), seed=1)
    perturber.reset(5)
    first = [perturber(frame) for _ in range(3)]
    perturber.reset(5)
    assert all(np.array_equal(a, perturber(frame)) for a in first)


def test_rain_is_fresh_per_frame_and_per_episode(frame):
    perturber = FramePerturber(Perturbation("rain", 100), seed=1)
    perturber.reset(5)
    a, b = perturber(frame), perturber(frame)
    assert not np.array_equal(a, b)  # new streaks every frame
    perturber.reset(6)
    assert not np.array_equal(perturber(frame), a)  # another track seed, other streaks
    streaked = (a != frame).any(-1)
    assert 100 * 4 * 0.4 < streaked.sum() < 100 * 8  # 4-8 px a streak, overlaps and frame edges lose some


def test_the_families_are_what_their_docstring_says(frame):
    fog = _apply("fog", 0.5, frame).astype(int)
    assert np.abs(fog - np.rint(0.5 * frame + 0.5 * VEIL)).max() <= 1
    dark = _apply("darkness", 0.5, frame).astype(int)  # gamma 2
    assert np.abs(dark - np.rint(255 * (frame / 255.0) ** 2)).max() <= 1
    assert _apply("darkness", 0.9, np.full_like(frame, 255)).min() == 255  # white stays white; brightness would not
    bgr = cv2.cvtColor(frame, cv2.COLOR_RGB2BGR)
    ok, coded = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, 30])
    assert ok and np.array_equal(_apply("jpeg", 70, frame), cv2.cvtColor(cv2.imdecode(coded, 1), cv2.COLOR_BGR2RGB))
    green = np.zeros_like(frame)
    green[..., 1] = 255
    assert (_apply("hue", 180, green) == [255, 0, 255]).all()  # green's opposite hue: magenta
    stripe = np.zeros_like(frame)
    stripe[:, 40] = 255
    blurred = _apply("motion_blur", 5, stripe)
    assert (blurred[:, 38:43, 0] == 51).all() and (blurred[:, :38] == 0).all()  # 5 px wide, 1/5 of the light each
    bar = np.zeros_like(frame)
    bar[40] = 255
    assert np.array_equal(_apply("motion_blur", 9, bar), bar)  # horizontal only


@pytest.mark.parametrize(
    "spec",
    ["fog:1", "fog:-0.1", "darkness:1", "jpeg:100", "jpeg:2.5", "jpeg:-1", "rain:1001", "rain:1.5",
     "hue:181", "hue:-1", "motion_blur:96", "motion_blur:-1", "fog:nan", "rain"],
)  # fmt: skip
def test_levels_out_of_range_are_refused(spec):
    with pytest.raises(ValueError):
        parse_perturbation(spec)


def test_a_frame_function_is_seeded_per_episode_and_its_output_checked(frame):
    def speckle(rgb, level, rng):
        out = rgb.copy()
        out[rng.integers(0, 96, 20), rng.integers(0, 96, 20)] = 255
        return out

    perturber = FunctionPerturber(speckle, 1.0, seed=2)
    perturber.reset(7)
    first = perturber(frame)
    perturber.reset(7)
    assert np.array_equal(perturber(frame), first) and not np.array_equal(first, frame)
    with pytest.raises(ValueError, match=r"my_fn returned \(96, 96\) uint8"):
        FunctionPerturber(lambda f, level, rng: f[..., 0], 1.0, name="my_fn")(frame)
    with pytest.raises(ValueError, match="float64"):
        check_frame(frame.astype(float), "x")
    with pytest.raises(ValueError, match="returned NoneType"):
        check_frame(None, "x")  # type: ignore[arg-type]
