"""The fast CarRacing renderer against stock gymnasium rendering, frame by frame, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pygame
import pytest
from gymnasium.envs.box2d.car_racing import CarRacing
from pygame import gfxdraw

from sim_bridges import fast_render as fr
from sim_bridges.fast_render import render_state_pixels

N_STEPS = 210


def _action(k: int, rng: np.random.Generator) -> np.ndarray:
    """Zoom-in second straight, a hard left at full gas (skids off the road), braking, a hard right, then noise."""
    if k < 55:
        return np.array([0.0, 0.5, 0.0])
    if k < 110:
        return np.array([-1.0, 1.0, 0.0])
    if k < 135:
        return np.array([0.0, 0.0, 0.8])
    if k < 190:
        return np.array([1.0, 0.6, 0.0])
    return np.array([rng.uniform(-1, 1), rng.uniform(0, 1), rng.uniform(0, 0.5)])


def _fast_env(**kwargs) -> CarRacing:
    env = CarRacing(**kwargs)
    env._render = lambda mode: render_state_pixels(env)  # what the CarRacing bridge does with fast_render=True
    return env


def test_twin_envs_agree_every_step_across_resets(monkeypatch):
    """Stock env vs an env rendering with ours: same observations, rewards and state at every step, 3 tracks."""
    branches = []
    covers = fr._fill_covers_visible_rows
    monkeypatch.setattr(fr, "_fill_covers_visible_rows", lambda vx, vy: branches.append(covers(vx, vy)) or branches[-1])
    stock, fast = CarRacing(), _fast_env()  # one pair across resets: per-episode caches must be rebuilt
    n_off_road = 0
    for seed in (0, 1, 2):
        obs_s, _ = stock.reset(seed=seed)
        obs_f, _ = fast.reset(seed=seed)
        assert np.array_equal(obs_s, obs_f), f"seed {seed}: reset frame differs"
        rng = np.random.default_rng(seed)
        for k in range(N_STEPS):
            a = _action(k, rng)
            obs_s, r_s, term_s, trunc_s, _ = stock.step(a)
            obs_f, r_f, term_f, trunc_f, _ = fast.step(a)
            assert obs_f.shape == (96, 96, 3) and obs_f.dtype == np.uint8
            n_diff = int((obs_s != obs_f).any(axis=2).sum())
            assert n_diff == 0, f"seed {seed} step {k}: {n_diff} pixels differ"
            assert (r_s, term_s, trunc_s) == (r_f, term_f, trunc_f), f"seed {seed} step {k}"
            assert (stock.t, stock.reward, stock.tile_visited_count) == (fast.t, fast.reward, fast.tile_visited_count)
            n_off_road += not fast.car.wheels[0].tiles
            if term_s:
                break
    assert n_off_road > 20, "the action script should drive off the road for a while"
    assert True in branches and False in branches, "both background paths (fill and stock calls) must be exercised"
    assert isinstance(fast.clock, pygame.time.Clock) and fast.surf.get_size() == (fr.W, fr.H)


def test_identical_under_domain_randomisation():
    """Float colours (domain_randomize) go through the same int conversions as stock."""
    env = CarRacing(domain_randomize=True)
    rng = np.random.default_rng(7)
    for seed in (3, 4):
        env.reset(seed=seed)
        for k in range(70):
            env.step(_action(k + 40, rng))
            assert np.array_equal(env._render("state_pixels"), render_state_pixels(env)), f"seed {seed} step {k}"


@pytest.mark.parametrize(
    "angle",
    [0.0, math.pi / 2, math.pi, 3 * math.pi / 2, 2 * math.pi, -math.pi / 2, -7 * math.pi / 2, 1e-7, math.pi - 4e-7]
    + [0.3, -2.9, 5.5, 1e-5, 123.456],
)
def test_vertex_maths_matches_vector2_rotate_rad(angle):
    """pygame-ce special-cases multiples of pi/2 (within 1e-6) and reduces the angle first: so must we."""
    rng = np.random.default_rng(0)
    polys = rng.uniform(-400, 400, size=(50, 4, 2))
    zoom, trans = 13.37, (512.25, -37.5)
    sx, sy = fr._to_screen(polys, zoom, trans, angle)
    for p in range(50):
        for v in range(4):
            c = pygame.math.Vector2(tuple(polys[p, v])).rotate_rad(angle)
            assert (sx[p, v], sy[p, v]) == (c[0] * zoom + trans[0], c[1] * zoom + trans[1])


def test_to_sint16_is_gfxdraw_int_conversion():
    v = np.array([-1.9, -0.5, 0.5, 1.9, 32767.9, 32768.2, -32769.5, 70000.0])
    expected = [np.int16(np.int64(int(x)).astype(np.int16)) for x in v]  # int() truncates, C cast wraps
    assert fr._to_sint16(v).tolist() == [int(e) for e in expected]


def test_fill_predicate_never_claims_more_than_gfxdraw_paints():
    """Whenever the background is replaced by a fill, real SDL_gfx would have painted every surviving pixel."""
    rng = np.random.default_rng(1)
    surf = pygame.Surface((fr.W, fr.H))
    color = (102, 204, 102)
    n_claimed = 0
    for _ in range(150):
        zoom, angle = rng.uniform(0.6, 16.2), rng.uniform(-7, 7)
        pos = rng.uniform(-345, 345, size=2)
        t = pygame.math.Vector2((-pos[0] * zoom, -pos[1] * zoom)).rotate_rad(angle)
        fx, fy = fr._to_screen(fr._FIELD, zoom, (fr.W / 2 + t[0], fr.H / 4 + t[1]), angle)
        vx, vy = fr._to_sint16(fx[0]).tolist(), fr._to_sint16(fy[0]).tolist()
        claimed = fr._fill_covers_visible_rows(vx, vy)
        surf.fill(0)
        gfxdraw.filled_polygon(surf, list(zip(vx, vy, strict=True)), color)
        painted = bool((pygame.surfarray.pixels2d(surf)[:, fr.HIDDEN_ROWS :] == surf.map_rgb(color)).all())
        assert painted or not claimed, f"claimed full cover but gfxdraw left gaps: {vx}, {vy}"
        n_claimed += claimed
    assert n_claimed > 30, "the fast path should apply to most camera poses"


def test_indicator_bar_hides_the_rows_we_skip():
    """Stock paints the bottom HIDDEN_ROWS rows opaque after the flip, so those world rows never matter."""
    env = CarRacing()
    env.reset(seed=0)
    frames = []
    for fill in ((255, 255, 255), (3, 7, 11)):
        env.surf = pygame.Surface((fr.W, fr.H))
        env.surf.fill(fill)
        env._render_indicators(fr.W, fr.H)
        frames.append(pygame.surfarray.array3d(env.surf)[:, fr.H - fr.HIDDEN_ROWS :])
    assert np.array_equal(frames[0], frames[1])
    assert not np.array_equal(pygame.surfarray.array3d(env.surf)[:, -fr.HIDDEN_ROWS - 1], frames[0][:, 0])


def test_needs_reset_first():
    with pytest.raises(ValueError, match="reset"):
        render_state_pixels(CarRacing())


def test_world_prefilter_drops_only_polygons_that_paint_nothing_visible():
    """Polygons the cheap world-space prefilter drops but the bounding-box test would keep: real SDL_gfx drawing
    of each must leave every surviving row untouched."""
    env = CarRacing()
    env.reset(seed=5)
    render_state_pixels(env)
    cache = fr._CACHES[env]
    polys = cache.geometry(env)
    surf = pygame.Surface((fr.W, fr.H))
    rng = np.random.default_rng(2)
    n_kept = n_checked = 0
    for _ in range(200):
        zoom, angle = rng.uniform(0.6, 16.2), rng.uniform(-7, 7)
        car = polys[rng.integers(len(polys)), 0] + rng.uniform(-30, 30, size=2)
        t = pygame.math.Vector2((-car[0] * zoom, -car[1] * zoom)).rotate_rad(angle)
        trans = (fr.W / 2 + t[0], fr.H / 4 + t[1])
        sx, sy = fr._to_screen(polys, zoom, trans, angle)
        ix, iy = fr._to_sint16(sx), fr._to_sint16(sy)
        drawn = set(np.flatnonzero(fr._stock_keeps(sx, sy) & fr._touches_output(ix, iy)).tolist())
        near = set(cache.near_view(zoom, trans, angle).tolist())
        n_kept += len(drawn & near)
        for i in drawn - near:
            surf.fill(0)
            pts = list(zip(ix[i].tolist(), iy[i].tolist(), strict=True))
            gfxdraw.aapolygon(surf, pts, (255, 255, 255))
            gfxdraw.filled_polygon(surf, pts, (255, 255, 255))
            assert not pygame.surfarray.pixels2d(surf)[:, fr.HIDDEN_ROWS :].any(), f"polygon {i} was visible: {pts}"
            n_checked += 1
    assert n_kept > 1000 and n_checked > 0


def test_font_shutdown_between_frames():
    """A cached font must not be used after pygame.font.quit(); the next frame re-initialises like stock."""
    env = CarRacing()
    env.reset(seed=0)
    render_state_pixels(env)
    pygame.font.quit()
    assert np.array_equal(render_state_pixels(env), env._render("state_pixels"))
