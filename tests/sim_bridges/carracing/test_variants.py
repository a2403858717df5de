"""CarRacingExtension's variants (sim_bridges/carracing/variants.py, drawn by sim_bridges/carracing/variant_draw.py):
each changes the frame only where its spec says, the rest pixel for pixel as the clean env (same seed, same actions);
deterministic per seed; both renderer paths draw the same pixels; registered with gymnasium."""

from __future__ import annotations

from pathlib import Path

import cv2
import gymnasium as gym
import numpy as np
import pygame
import pytest

from sim_bridges import registry
from sim_bridges.carracing import fast_render, variant_draw
from sim_bridges.carracing.bridge import CarRacingBridge
from sim_bridges.carracing.variants import FIELD, GRASS, OFFSET, Variant, parse_variant

SEED, N_STEPS = 1000, 60
BAR_ROW = 84  # the indicator bar's first row in the 96 x 96 frame (100 of 800 rows)


def _actions(n: int = N_STEPS) -> np.ndarray:
    t = np.arange(n)
    return np.stack([0.3 * np.sin(t / 7.0), np.full(n, 0.4), np.zeros(n)], 1).astype(np.float32)


def _frames(variant: Variant | str | None = None, seed: int = SEED, n: int = N_STEPS) -> tuple[np.ndarray, object]:
    env = CarRacingBridge(variant=variant)
    frames = [env.reset(seed=seed)[0]]
    frames += [env.step(a)[0] for a in _actions(n)]
    return np.stack(frames), env


@pytest.fixture(scope="module")
def clean() -> np.ndarray:
    return _frames()[0]


def _interior(mask: np.ndarray) -> np.ndarray:
    """Pixels of a (T, 96, 96) mask whose 3 x 3 neighbourhood is all in it (away from anti-aliased edges)."""
    m = np.pad(mask, ((0, 0), (1, 1), (1, 1)))
    return np.all([m[:, 1 + dy : 97 + dy, 1 + dx : 97 + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1)], axis=0)


def _is(frames: np.ndarray, rgb) -> np.ndarray:
    return np.all(frames == np.asarray(rgb, np.uint8), axis=-1)


def _shrunk(rgb) -> np.ndarray:
    """What the frame shows for a surface of one colour (smoothscale's fixed point shifts values by a little)."""
    surf = pygame.Surface((1000, 800))
    surf.fill(tuple(int(c) for c in rgb))
    return pygame.surfarray.array3d(pygame.transform.smoothscale(surf, (96, 96)))[48, 40]


def _car(frames: np.ndarray) -> np.ndarray:
    """The hull's own pixels: near the frame's car position (column 48, row 72), red with no green at all (the car is
    two or three pixels wide at full zoom: every other pixel of it mixes with the road or grass beside it)."""
    car = np.zeros(frames.shape[:3], bool)
    car[:, 60:BAR_ROW, 42:55] = True
    return car & (frames[..., 0] >= 150) & (frames[..., 1] == 0)


def _grey(frames: np.ndarray) -> np.ndarray:
    """Road pixels: grey, as stock's road colours (102 plus 0, 2.55 or 5.1) come out of the shrink."""
    r, g, b = (frames[..., i].astype(int) for i in range(3))
    return (r == g) & (g == b) & (r >= 95) & (r <= 110)


@pytest.mark.parametrize("kind", ["color", "color3"])
def test_color_moves_road_and_field_only_within_a_fifth(clean, kind):
    frames, env = _frames(kind)
    ev = env.episode_variant
    for offset in (ev.road_offset, ev.field_offset):
        assert np.all(np.abs(offset) <= OFFSET) and (len(set(offset.tolist())) == 1) == (kind == "color")
    changed = np.any(frames != clean, axis=-1)
    assert changed[:, :BAR_ROW].mean() > 0.5 and not changed[:, BAR_ROW:].any()  # the indicator bar is untouched
    assert _car(clean).sum() > 20 and not changed[_car(clean)].any()
    field = _interior(_is(clean, _shrunk(FIELD)))  # the field's inside: the shifted colour exactly
    assert field.sum() > 1000 and np.all(frames[field] == _shrunk(np.trunc(FIELD + ev.field_offset)))
    patches = _interior(_is(clean, _shrunk(GRASS)))  # theirs keeps the lighter patches' colour
    assert patches.sum() > 100 and not changed[patches].any()
    road = _interior(_grey(clean))
    assert road.sum() > 100 and changed[road].all()
    assert not np.array_equal(_frames(kind, seed=SEED + 1)[1].episode_variant.road_offset, ev.road_offset)


def test_bars_are_black_and_the_only_change(clean):
    frames, _ = _frames("bar")
    changed = np.any(frames != clean, axis=-1)
    region = np.zeros((96, 96), bool)
    region[:BAR_ROW, :8] = region[:BAR_ROW, 88:] = True  # x in [0, 75] and [925, 999] of 1000: columns 0-7, 88-95
    assert changed.any() and not changed[:, ~region].any()
    assert np.all(frames[:, :BAR_ROW, :7] == 0) and np.all(frames[:, :BAR_ROW, 89:] == 0)  # wholly covered columns


def test_blob_is_red_beside_the_car_and_the_only_change(clean):
    frames, env = _frames("blob")
    car = env.car
    centre = np.mean(variant_draw.blob_world(car), axis=0)  # 8 x 8 from (1.0, -2.4) + (20, 10) in the hull's frame
    np.testing.assert_allclose(centre, car.hull.GetWorldPoint((1.0 + 20 + 4, -2.4 + 10 + 4)), atol=1e-3)
    changed = np.any(frames != clean, axis=-1)
    red = _is(frames, _shrunk(variant_draw.BLOB_RGB))
    assert (red[-1] & changed[-1]).sum() > 50  # the hull is red too: the blob's red is where the frame changed
    # the last frame (zoom settled): changes only within the blob's screen box, 2 px of shrink and edges around it
    x, y = variant_draw.blob_screen(car, 2.7 * 6, *_view(env)).T
    cols, rows = x * 96 / 1000, (799 - y) * 96 / 800  # unflipped 1000 x 800 surface -> frame
    box = np.zeros((96, 96), bool)
    box[max(int(rows.min()) - 2, 0) : int(rows.max()) + 3, max(int(cols.min()) - 2, 0) : int(cols.max()) + 3] = True
    assert changed[-1].any() and not changed[-1][~box].any()
    car_at = np.argwhere(_car(clean[-1:])[0]).mean(axis=0)
    assert np.all(np.hypot(*(np.argwhere(changed[-1]) - car_at).T) < 60)  # within ~33 world units of the hull


def _view(env) -> tuple[tuple[float, float], float]:
    """(trans, angle) of the frame just drawn at full zoom, as stock computes them."""
    angle = -env.car.hull.angle
    zoom = 2.7 * 6
    trans = pygame.math.Vector2((-env.car.hull.position[0] * zoom, -env.car.hull.position[1] * zoom)).rotate_rad(angle)
    return (500 + trans[0], 200 + trans[1]), angle


def test_noise_changes_the_grass_every_frame_and_nothing_else(clean):
    frames, _ = _frames("noise")
    changed = np.any(frames != clean, axis=-1)
    grass = _interior(_is(clean, _shrunk(FIELD)) | _is(clean, _shrunk(GRASS)))
    assert grass[1:].sum() > 1000 and changed[grass].mean() > 0.99
    fresh = np.any(frames[1:] != frames[:-1], axis=-1)  # frame t against t - 1
    assert fresh[grass[1:] & grass[:-1]].mean() > 0.99
    road = _interior(_grey(clean))
    assert road.sum() > 100 and not changed[road].any()
    assert _car(clean).sum() > 20 and not changed[_car(clean)].any() and not changed[:, BAR_ROW:].any()
    other, _ = _frames(Variant("noise", seed=1))  # the same track, another variant seed
    assert np.any(other[grass] != frames[grass], axis=-1).mean() > 0.99


def _video(folder: Path) -> list[np.ndarray]:
    """Three 8 x 8 frames, named out of lexicographic order, each of four one-colour quadrants (RGB)."""
    quads = [[(255, 0, 0), (0, 0, 255), (40, 40, 40), (0, 255, 0)], [(0, 255, 255), (255, 255, 0), (9, 9, 9),
             (255, 0, 255)], [(200, 100, 50), (50, 100, 200), (0, 0, 0), (255, 255, 255)]]  # fmt: skip
    frames = []
    for name, (tl, tr, bl, br) in zip(["f1.png", "f2.png", "f10.png"], quads, strict=True):
        rgb = np.zeros((8, 8, 3), np.uint8)
        rgb[:4, :4], rgb[:4, 4:], rgb[4:, :4], rgb[4:, 4:] = tl, tr, bl, br
        cv2.imwrite(str(folder / name), rgb[..., ::-1])
        frames.append(rgb)
    return frames


def test_video_grass_is_the_frame_in_order_and_north_up(tmp_path):
    video = _video(tmp_path)
    shown = {}
    for variant in (None, f"video={tmp_path}"):
        env = CarRacingBridge(variant=variant)
        env.reset(seed=SEED)
        env.t = 1.0  # the zoom settled
        obs = [env.place_car(200.0, 200.0, np.pi / 2)[0]]  # north-east quarter, nose north: image top-right
        obs += [env.step(np.zeros(3, np.float32))[0] for _ in range(4)]
        shown[variant is None] = np.stack(obs)
    clean, frames = shown[True], shown[False]
    grass = _interior(_is(clean, _shrunk(FIELD)) | _is(clean, _shrunk(GRASS)))
    assert grass.sum(axis=(1, 2)).min() > 500
    for t in range(len(frames)):  # frame 0 was drawn at reset: place_car draws frame 1, then one per step
        expected = _shrunk(video[(t + 1) % 3][0, 7])
        assert np.all(frames[t][grass[t]] == expected), t
    road = _interior(_grey(clean))
    assert not np.any(frames[road] != clean[road]) and np.array_equal(frames[:, BAR_ROW:], clean[:, BAR_ROW:])


@pytest.mark.parametrize("kind", ["color", "color3", "bar", "blob", "noise"])
def test_each_variant_replays_under_its_seed(kind):
    first, _ = _frames(kind, n=12)
    again, _ = _frames(kind, n=12)
    np.testing.assert_array_equal(first, again)


@pytest.mark.parametrize("kind", ["bar", "blob"])
def test_the_pygame_path_draws_the_same_pixels(kind, monkeypatch):
    exact, _ = _frames(kind, n=55)
    monkeypatch.setattr(fast_render, "_world_exact", lambda *args: None)
    slow, _ = _frames(kind, n=55)
    np.testing.assert_array_equal(slow, exact)


def test_registered_ids_and_specs(tmp_path):
    registry.register()
    env = gym.make("drive/CarRacingColor3-v0", max_episode_steps=20)
    registry.check_bridge(env)
    assert str(env.unwrapped.variant) == "color3"
    _video(tmp_path)
    env = gym.make("drive/CarRacingVideo-v0", video_dir=str(tmp_path))
    assert env.reset(seed=1)[0].shape == (96, 96, 3) and env.spec.id == registry.VARIANT_IDS["video"]
    assert parse_variant(f"video={tmp_path}") == Variant("video", str(tmp_path))
    for bad, says in [("mud", "choose one of"), ("video", "folder of PNG"), ("bar=x", "folder of PNG"),
                      (f"video={tmp_path / 'none'}", "not a folder")]:  # fmt: skip
        with pytest.raises(ValueError, match=says):
            parse_variant(bad)
    with pytest.raises(ValueError, match="fast renderer"):
        CarRacingBridge(fast_render=False, variant="bar")


def test_no_variant_again_is_the_clean_env(clean):
    env = CarRacingBridge(variant="color3")
    assert not np.array_equal(env.reset(seed=SEED)[0], clean[0])
    env.set_variant(None)
    np.testing.assert_array_equal(env.reset(seed=SEED)[0], clean[0])
