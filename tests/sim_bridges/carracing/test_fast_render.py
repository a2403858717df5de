"""The fast CarRacing renderer against stock gymnasium rendering, frame by frame, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pygame
import pytest
from gymnasium.envs.box2d.car_racing import CarRacing
from pygame import gfxdraw

from sim_bridges.carracing import fast_render as fr
from sim_bridges.carracing import render_geometry as rg
from sim_bridges.carracing import view
from sim_bridges.carracing.fast_render import render_state_pixels

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


def test_envs_rendered_in_turn_and_on_two_threads_match_stock():
    """Envs of one thread share its canvases and frame buffers (shrink._scratch) and keep their own bar rows: three
    envs stepped in turn (bars that differ and change, one kept unchanged while the others draw theirs) give stock's
    frames; a fourth rendered on another thread at the same time uses that thread's own buffers, and so does an env
    handed to another thread."""
    import threading

    seeds, n = (0, 1, 2), 120
    stock = []
    for seed in seeds:  # the reference: each env alone
        env = CarRacing()
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        stock.append([env.step(_action(k + 40 * seed, rng))[0] for k in range(n)])
        env.close()
    other: list[np.ndarray] = []

    def drive_alone() -> None:
        env = _fast_env()
        env.reset(seed=seeds[0])
        rng = np.random.default_rng(seeds[0])
        other.extend(env.step(_action(k, rng))[0] for k in range(n))

    fast = [_fast_env() for _ in seeds]
    for env, seed in zip(fast, seeds, strict=True):
        env.reset(seed=seed)
    rngs = [np.random.default_rng(seed) for seed in seeds]
    thread = threading.Thread(target=drive_alone)
    thread.start()
    for k in range(n):
        for i, env in enumerate(fast):
            obs = env.step(_action(k + 40 * i, rngs[i]))[0]
            assert np.array_equal(obs, stock[i][k]), f"env {i} step {k}"
    thread.join()
    assert len(other) == n and all(np.array_equal(a, b) for a, b in zip(other, stock[0], strict=True))
    assert fr._CACHES[fast[0]].tiles.colour is fr._CACHES[fast[1]].tiles.colour  # one canvas for the thread's envs
    handed_over: list[np.ndarray] = []  # an env made on this thread, stepped on another: that thread's buffers
    rng = np.random.default_rng(seeds[1])
    moved = threading.Thread(target=lambda: handed_over.extend(fast[1].step(_action(n + 40, rng))[0] for _ in "ab"))
    moved.start()
    moved.join()
    assert fr._CACHES[fast[1]].tiles.colour is not fr._CACHES[fast[0]].tiles.colour and len(handed_over) == 2


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
    sx, sy = rg.to_screen(polys, zoom, trans, angle)
    for p in range(50):
        for v in range(4):
            c = pygame.math.Vector2(tuple(polys[p, v])).rotate_rad(angle)
            assert (sx[p, v], sy[p, v]) == (c[0] * zoom + trans[0], c[1] * zoom + trans[1])


def test_to_sint16_is_gfxdraw_int_conversion():
    v = np.array([-1.9, -0.5, 0.5, 1.9, 32767.9, 32768.2, -32769.5, 70000.0])
    expected = [np.int16(np.int64(int(x)).astype(np.int16)) for x in v]  # int() truncates, C cast wraps
    assert rg.to_sint16(v).tolist() == [int(e) for e in expected]


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
        fx, fy = rg.to_screen(rg.FIELD, zoom, (fr.W / 2 + t[0], fr.H / 4 + t[1]), angle)
        vx, vy = rg.to_sint16(fx[0]).tolist(), rg.to_sint16(fy[0]).tolist()
        claimed = rg.fill_covers_visible_rows(vx, vy)
        assert view.fill_covers(np.array(vx), np.array(vy)) == claimed, "numba kernel vs Python reference"
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


def test_view_kernels_match_the_numpy_reference():
    """`sim_bridges.carracing.view`'s culling and vertex maths, bit for bit the numpy reference in `render_geometry`, on
    random views (quarter turns included) of a real track, and the car's polygons over a drive."""
    env = CarRacing()
    env.reset(seed=5)
    render_state_pixels(env)
    polys = fr._CACHES[env].geometry(env)
    keep, ix, iy = np.zeros(len(polys), np.int64), np.zeros((len(polys), 4), np.int64), np.zeros((len(polys), 4), int)
    rng = np.random.default_rng(2)
    angles = [*rng.uniform(-7, 7, 150), 0.0, math.pi / 2, -math.pi, 3 * math.pi / 2 + 1e-7]
    n_kept = 0
    for angle in angles:
        zoom = rng.choice([rng.uniform(0.6, 16.2), 16.2])
        car = polys[rng.integers(len(polys)), 0] + rng.uniform(-30, 30, size=2)
        t = pygame.math.Vector2((-car[0] * zoom, -car[1] * zoom)).rotate_rad(angle)
        trans = (fr.W / 2 + t[0], fr.H / 4 + t[1])
        sx, sy = rg.to_screen(polys, zoom, trans, angle)
        rx, ry = rg.to_sint16(sx), rg.to_sint16(sy)
        ref = np.flatnonzero(rg.stock_keeps(sx, sy) & rg.touches_output(rx, ry))
        k = view.visible_polygons(polys, *view.rotation(angle), zoom, *trans, rg.cr.MAX_SHAPE_DIM, True, keep, ix, iy)
        assert np.array_equal(keep[:k], ref) and np.array_equal(ix[:k], rx[ref]) and np.array_equal(iy[:k], ry[ref])
        n_kept += k
    assert n_kept > 1000
    n_cars = 0
    for k in range(150):
        env.step(_action(k, rng))
        for angle in (-env.car.hull.angle, rng.uniform(-7, 7), math.pi / 2):
            zoom, trans = rng.uniform(0.6, 16.2), (rng.uniform(0, 1000), rng.uniform(0, 800))
            ref_car = rg.car_screen(env.car, zoom, trans, angle)
            mine = view.car_screen(env.car, zoom, trans, view.rotation(angle))
            assert (ref_car is None) == (mine is None)
            if mine is not None:
                assert all(np.array_equal(a, b) for a, b in zip(ref_car, mine, strict=True)), f"step {k}"
                n_cars += 1
    assert n_cars > 200


def test_indicator_bar_on_odd_states_matches_stock():
    """The bar from `sim_bridges.carracing.indicators` (reversing wheels, spins, tiny and huge values, a score change)
    against stock drawing of the same state, frame by frame; unchanged inputs reuse the shrunk rows."""
    env = CarRacing()
    env.reset(seed=3)
    rng = np.random.default_rng(9)
    for k in range(120):
        env.step(_action(k + 100, rng))
        if k % 3 == 0:
            env.car.hull.angularVelocity = float(rng.choice([0.0, 5e-5, rng.normal(0, 3), rng.normal(0, 80)]))
            for w in env.car.wheels:
                w.omega = float(rng.choice([0.0, -3e-5, rng.normal(0, 60), -rng.uniform(0, 400)]))
        if k % 10 == 5:
            env.reward += rng.uniform(-50, 50)
        assert np.array_equal(render_state_pixels(env), env._render("state_pixels")), f"step {k}"
        assert np.array_equal(render_state_pixels(env), env._render("state_pixels")), f"step {k}, cached bar"


def _stock_rects(values):
    """gymnasium 1.4.0 `_render_indicators`' rectangles, its Python float maths transcribed, vertices int()-ed."""
    s, h = fr.W / 40.0, fr.H / 40.0
    speed, w0, w1, w2, w3, steer, yaw = values
    out = []
    for value, place, val, vertical in ((speed, 5, 0.02 * speed, True), (w0, 7, 0.01 * w0, True),
                                         (w1, 8, 0.01 * w1, True), (w2, 9, 0.01 * w2, True),
                                         (w3, 10, 0.01 * w3, True), (steer, 20, -10.0 * steer, False),
                                         (yaw, 30, -0.8 * yaw, False)):  # fmt: skip
        if not abs(value) > 1e-4:
            continue
        if vertical:
            top = fr.H - (h + h * val)
            pts = (place * s, top, (place + 1) * s, top, (place + 1) * s, fr.H - h, (place + 0) * s, fr.H - h)
        else:
            pts = ((place + 0) * s, fr.H - 4 * h, (place + val) * s, fr.H - 4 * h, (place + val) * s, fr.H - 2 * h,
                   (place + 0) * s, fr.H - 2 * h)  # fmt: skip
        if not all(-4096 < p < 4096 for p in pts):
            return None
        out.append([int(p) for p in pts])
    return out


def test_indicator_rects_kernel_is_the_stock_float_maths():
    """`indicators.indicator_rects` (numba) against the stock expressions in Python on values from tiny to out of
    range, NaN and infinities included: the same int vertices, or both out of range."""
    from sim_bridges.carracing.indicators import indicator_rects

    rng = np.random.default_rng(4)
    out = np.empty((7, 9), np.int64)
    specials = [0.0, -0.0, 1e-4, -1e-4, 1.0001e-4, np.nan, np.inf, -np.inf, 1e6, -1e6]
    for _ in range(3000):
        draws = [
            rng.choice(specials) if rng.random() < 0.2 else rng.normal(0, 10 ** rng.uniform(-5, 3)) for _ in range(8)
        ]
        vx, vy, *rest = (float(v) for v in draws)
        n = indicator_rects(vx, vy, *rest, out)
        ref = _stock_rects((math.sqrt(vx * vx + vy * vy), *rest))
        assert (n < 0) == (ref is None), (vx, vy, rest)
        if ref is not None:
            assert out[:n, :8].tolist() == ref, (vx, vy, rest)


def test_score_text_band_and_its_fallback_match_stock():
    """The score text's columns shrunk once per string (`indicators._text_band`) beside rectangles drawn alone, and
    the joint drawing where a rectangle reaches the text's columns (a yaw rate whose bar runs left past the score)
    or the text is wider: each frame equals stock's, and both paths run."""
    from sim_bridges.carracing import indicators

    env = CarRacing()
    env.reset(seed=4)
    drawn = []
    draw_bar = indicators.draw_bar
    indicators.draw_bar = lambda rects, block, *rest: (
        drawn.append((len(rects), block.size)) or draw_bar(rects, block, *rest)
    )
    try:
        for k, (yaw, reward) in enumerate([(0.5, 12.0), (-2.0, 12.0), (40.0, 12.0), (-40.0, 345.0), (1.0, -1234.0),
                                           (0.0, 99999.0), (60.0, 99999.0), (3.0, 12.0)]):  # fmt: skip
            env.step(np.array([0.2, 0.5, 0.0]))
            env.car.hull.angularVelocity, env.reward = yaw, reward
            drawn.clear()
            assert np.array_equal(render_state_pixels(env), env._render("state_pixels")), f"frame {k}"
            joint = any(n_rects and size for n_rects, size in drawn)
            assert joint == (yaw in (40.0, 60.0) or reward == 99999.0), (k, drawn)  # 40 rad/s: a yaw bar past x = 0
    finally:
        indicators.draw_bar = draw_bar


def test_score_text_palette_indices_write_what_a_blit_writes():
    """Every score string shares one palette (so one is kept per pixel format), and its indices mapped through it
    are the pixels stock's blit of the rendered text writes, on 24- and 32-bit canvases."""
    from sim_bridges.carracing.indicators import Fonts, text_block, text_palette

    pygame.font.init()
    strings = [f"{v:04d}" for v in range(-120, 1000, 7)] + ["0000", "-000", "9999", f"{123456:04d}"]
    first = Fonts.text(strings[0]).get_palette()
    for depth in (24, 32):
        like = pygame.Surface((8, 8), 0, depth)
        for s in strings:
            text = Fonts.text(s)
            assert text.get_palette() == first, s
            blitted = pygame.Surface(text.get_size(), 0, like)
            blitted.fill(0)
            blitted.blit(text, (0, 0))
            expected = pygame.surfarray.array2d(blitted).T & 0xFFFFFF
            assert np.array_equal(text_palette(text, like)[text_block(text)], expected), (depth, s)


def test_font_shutdown_between_frames():
    """A cached font must not be used after pygame.font.quit(); the next frame re-initialises like stock."""
    env = CarRacing()
    env.reset(seed=0)
    render_state_pixels(env)
    pygame.font.quit()
    assert np.array_equal(render_state_pixels(env), env._render("state_pixels"))


# --- the numba rasteriser (sim_bridges.carracing.raster) against the pygame / SDL_gfx calls it re-implements ---


def _canvas_pixels(tiles) -> np.ndarray:
    """The tiled canvas expanded to (H - HIDDEN_ROWS, W) 0xRRGGBB pixels."""
    widths = tiles.t_end - tiles.t_start + 1
    out = np.empty((fr.H - fr.HIDDEN_ROWS, fr.W), np.int64)
    for r in range(out.shape[0]):
        x = 0
        for j, w in enumerate(widths):
            c = tiles.colour[r, j]
            out[r, x : x + w] = c if c >= 0 else tiles.pool[-c - 1, :w]
            x += w
    return out


def _random_polygons(rng, n: int, spread: float) -> tuple[np.ndarray, np.ndarray]:
    """Quads around the visible rows: rotated rectangles (like grass and road) and arbitrary convex-ish quads,
    some reaching past the surface, some with horizontal or vertical edges."""
    xs, ys = [], []
    for k in range(n):
        cx, cy = rng.uniform(-100, fr.W + 100), rng.uniform(fr.HIDDEN_ROWS - 150, fr.H + 100)
        if k % 4 == 3:  # axis-aligned: vertical and horizontal edges, SDL_gfx's special cases
            w, h = rng.integers(0, int(spread), 2)
            pts = [(cx - w, cy - h), (cx + w, cy - h), (cx + w, cy + h), (cx - w, cy + h)]
        else:
            a = rng.uniform(0, 2 * math.pi)
            w, h = rng.uniform(0.3, spread, 2)
            pts = [(cx + math.cos(a) * u - math.sin(a) * v, cy + math.sin(a) * u + math.cos(a) * v)
                   for u, v in ((-w, -h), (w, -h), (w, h), (-w, h))]  # fmt: skip
        xs.append([int(p[0]) for p in pts])
        ys.append([int(p[1]) for p in pts])
    return np.array(xs, np.int64), np.array(ys, np.int64)


@pytest.mark.parametrize("spread", [3.0, 60.0, 400.0])
def test_raster_world_matches_gfxdraw(spread):
    """aapolygon + filled_polygon, polygon after polygon over a background, pixel for pixel on the visible rows."""
    rng = np.random.default_rng(int(spread))
    tiles = fr.shrink.Tiles(pygame.transform.get_smoothscale_backend())
    surf = pygame.Surface((fr.W, fr.H))
    for trial in range(6):
        px, py = _random_polygons(rng, 25, spread)
        colours = rng.integers(0, 1 << 24, len(px))
        bg = int(rng.integers(0, 1 << 24))
        assert fr.raster.draw_world(px, py, colours, bg, tiles.canvas())
        surf.fill(bg)
        for vx, vy, c in zip(px.tolist(), py.tolist(), colours.tolist(), strict=True):
            rgb = ((c >> 16) & 255, (c >> 8) & 255, c & 255)
            gfxdraw.aapolygon(surf, list(zip(vx, vy, strict=True)), rgb)
            gfxdraw.filled_polygon(surf, list(zip(vx, vy, strict=True)), rgb)
        ref = pygame.surfarray.pixels2d(surf).T[fr.HIDDEN_ROWS :] & 0xFFFFFF
        mine = _canvas_pixels(tiles)
        assert np.array_equal(mine, ref), f"trial {trial}: {int((mine != ref).sum())} pixels differ"


def test_raster_car_polygons_match_draw_polygon():
    """pygame.draw.polygon's fill (4- to 8-gons, float vertices truncated like pygame) on the visible rows."""
    rng = np.random.default_rng(3)
    tiles = fr.shrink.Tiles(pygame.transform.get_smoothscale_backend())
    surf = pygame.Surface((fr.W, fr.H))
    for trial in range(20):
        n_poly = 12
        counts = rng.integers(4, 9, n_poly)
        px, py = np.zeros((n_poly, 8), np.int64), np.zeros((n_poly, 8), np.int64)
        colours = rng.integers(0, 1 << 24, n_poly)
        surf.fill(0)
        fr.raster.draw_world(px[:0, :4], py[:0, :4], colours[:0], 0, tiles.canvas())  # clears the canvas
        for k in range(n_poly):
            c = rng.uniform([0, fr.HIDDEN_ROWS - 20], [fr.W, fr.H])
            r = rng.uniform(0.5, 60)
            ang = np.sort(rng.uniform(0, 2 * math.pi, counts[k])) if k % 2 else rng.uniform(0, 7, counts[k])
            pts = [(c[0] + r * math.cos(a), c[1] + r * math.sin(a)) for a in ang]
            pts = [(max(p[0], 0.0), max(p[1], 0.0)) for p in pts]
            px[k, : counts[k]] = [int(p[0]) for p in pts]
            py[k, : counts[k]] = [int(p[1]) for p in pts]
            rgb = ((colours[k] >> 16) & 255, (colours[k] >> 8) & 255, colours[k] & 255)
            pygame.draw.polygon(surf, rgb, pts)
        fr.raster_car.draw_car(px, py, counts, colours, tiles.canvas())
        ref = pygame.surfarray.pixels2d(surf).T[fr.HIDDEN_ROWS :] & 0xFFFFFF
        mine = _canvas_pixels(tiles)
        assert np.array_equal(mine, ref), f"trial {trial}: {int((mine != ref).sum())} pixels differ"


@pytest.mark.parametrize("backend", ["SSE2", "GENERIC"])
def test_raster_shrinks_match_smoothscale(backend):
    """Both smoothscale passes, from tiles (uniform and pooled) and from rows, against pygame's, per backend."""
    previous = pygame.transform.get_smoothscale_backend()
    try:
        pygame.transform.set_smoothscale_backend(backend)
    except ValueError:
        pytest.skip(f"{backend} smoothscale not available here")
    try:
        rng = np.random.default_rng(4)
        tiles = fr.shrink.Tiles(backend)
        px, py = _random_polygons(rng, 30, 40.0)
        fr.raster.draw_world(px, py, rng.integers(0, 1 << 24, len(px)), 0x123456, tiles.canvas())
        tiles.colour[::7] = -1 - np.arange(tiles.colour.shape[1])  # some rows: every tile pooled with noise
        tiles.pool[: tiles.colour.shape[1]] = rng.integers(0, 1 << 24, tiles.pool[: tiles.colour.shape[1]].shape)
        canvas = _canvas_pixels(tiles)
        surf = pygame.Surface((fr.W, canvas.shape[0]))
        pygame.surfarray.pixels2d(surf)[:] = canvas.T
        ref = pygame.surfarray.array3d(pygame.transform.smoothscale(surf, (96, canvas.shape[0])))  # (96, n, 3)
        world = np.zeros((canvas.shape[0], 96 * 3), np.uint8)
        fr.shrink.shrink_rows(tiles.canvas(), tiles.xc, tiles.xfrac, tiles.xrecip, tiles.shift, tiles.saturate, world)
        assert np.array_equal(world[::-1].reshape(-1, 96, 3), ref.transpose(1, 0, 2))
        with pytest.raises(ValueError, match="multiple of 8"):  # it reads its flags 8 tiles at a time
            fr.shrink.shrink_rows(tiles.canvas(), tiles.xc, tiles.xfrac, tiles.xrecip, tiles.shift, tiles.saturate,
                                  world[:, : 95 * 3])  # fmt: skip
        plain = np.zeros_like(world)
        fr.shrink.shrink_pixels(
            canvas.astype(np.uint32), tiles.t_start, tiles.t_end, tiles.xc, tiles.xfrac, tiles.xrecip, tiles.shift,
            tiles.saturate, plain,
        )  # fmt: skip
        assert np.array_equal(plain.reshape(-1, 96, 3), ref.transpose(1, 0, 2))

        tall = rng.integers(0, 256, (fr.H, 96, 3), dtype=np.uint8)
        tall[: fr.H // 2] = tall[0]  # long one-colour stretches too
        surf = pygame.surfarray.make_surface(tall.transpose(1, 0, 2))
        ref = pygame.surfarray.array3d(pygame.transform.smoothscale(surf, (96, 96))).transpose(1, 0, 2)
        out = np.zeros((96, 96 * 3), np.uint8)
        fr.shrink.shrink_columns(
            tall.reshape(fr.H, -1), tiles.r_start, tiles.r_end, tiles.yc, tiles.yfrac, tiles.yrecip, tiles.shift,
            tiles.saturate, out,
        )  # fmt: skip
        assert np.array_equal(out.reshape(96, 96, 3), ref)
    finally:
        pygame.transform.set_smoothscale_backend(previous)


def test_exact_path_draws_almost_every_frame(monkeypatch):
    """The numba path, not the pygame fallback, renders the frames of an ordinary drive (and they are exact)."""
    results = []
    exact = fr._world_exact
    monkeypatch.setattr(fr, "_world_exact", lambda *a: results.append(exact(*a)) or results[-1])
    stock, fast = CarRacing(), _fast_env()
    stock.reset(seed=6)
    fast.reset(seed=6)
    rng = np.random.default_rng(6)
    for k in range(60):
        a = _action(k, rng)
        assert np.array_equal(stock.step(a)[0], fast.step(a)[0]), f"step {k}"
    assert sum(r is not None for r in results) >= 0.9 * len(results)


def test_pygame_fallback_is_exact_too(monkeypatch):
    """Where the numba path declines (here: forced), the pygame path draws the same frames as stock."""
    monkeypatch.setattr(fr, "_world_exact", lambda *a: None)
    stock, fast = CarRacing(), _fast_env()
    stock.reset(seed=8)
    fast.reset(seed=8)
    rng = np.random.default_rng(8)
    for k in range(30):
        a = _action(k + 40, rng)
        assert np.array_equal(stock.step(a)[0], fast.step(a)[0]), f"step {k}"


def _sweep_action(k: int, seed: int, rng: np.random.Generator) -> np.ndarray:
    """Per seed a different script: straights, full-lock spins at full gas, hard braking, off-track drives, noise."""
    phase = (k // 60 + seed) % 5
    if phase == 0:
        return np.array([0.0, 1.0, 0.0])
    if phase == 1:
        return np.array([1.0 if seed % 2 else -1.0, 1.0, 0.0])
    if phase == 2:
        return np.array([rng.uniform(-0.3, 0.3), 0.0, 1.0])
    if phase == 3:
        return np.array([-0.6, 0.8, 0.0])
    return np.array([rng.uniform(-1, 1), rng.uniform(0, 1), rng.uniform(0, 0.6)])


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_long_sweep_stock_vs_fast(seed):
    """1000 steps (zoom-in included, then spins and off-track stretches) on a stock/fast twin pair, every frame
    compared; odd seeds with domain_randomize. Run: pytest -m slow tests/sim_bridges/carracing/test_fast_render.py"""
    kwargs = {"domain_randomize": bool(seed % 2)}
    stock, fast = CarRacing(**kwargs), _fast_env(**kwargs)
    obs_s, _ = stock.reset(seed=100 + seed)
    obs_f, _ = fast.reset(seed=100 + seed)
    assert np.array_equal(obs_s, obs_f)
    rng = np.random.default_rng(seed)
    for k in range(1000):
        a = _sweep_action(k, seed, rng)
        obs_s, r_s, term_s, trunc_s, _ = stock.step(a)
        obs_f, r_f, term_f, trunc_f, _ = fast.step(a)
        assert np.array_equal(obs_s, obs_f), f"seed {seed} step {k}: {int((obs_s != obs_f).any(2).sum())} pixels"
        assert (r_s, term_s) == (r_f, term_f)
        if term_s:
            obs_s, _ = stock.reset(seed=200 + seed)
            obs_f, _ = fast.reset(seed=200 + seed)
            assert np.array_equal(obs_s, obs_f)


def test_raster_declines_when_its_pixel_pool_could_overflow():
    """No out-of-bounds writes in numba: a frame that could need more pool slots than exist is declined."""
    tiles = fr.shrink.Tiles(pygame.transform.get_smoothscale_backend())
    tiles.pool = np.zeros((8, 16), np.int32)
    px, py = np.array([[100, 900, 880, 120]]), np.array([[150, 170, 700, 690]])
    assert not fr.raster.draw_world(px, py, np.array([0x336699]), 0x102030, tiles.canvas())
    counts, colours = np.array([4]), np.array([0xCC0000])
    assert not fr.raster_car.draw_car(
        np.array([[10, 990, 980, 20] * 2]), py.repeat(2, 1), counts, colours, tiles.canvas()
    )
