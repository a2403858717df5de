"""Fast CarRacing-v3 `state_pixels` renderer, bit-for-bit identical to gymnasium 1.4.0's `_render`.

Stock rendering spends most of its time in Python: every frame it rotates each vertex of 400 grass patches and
~600 road polygons through `pygame.math.Vector2`, scan-fills a background polygon over ~15,000 mostly off-screen
rows, flips the 1000x800 surface and loads the font from disk. Here the same float maths runs vectorised in
numpy and the same pygame/SDL_gfx calls get the same integer vertices, in the same order. Skipped is only work
that provably changes no pixel of the 96x96 output:

- polygons stock culls (its MAX_SHAPE_DIM test, reproduced) or whose pixels all miss the surviving rows: rows
  0..99 before the flip end up under the opaque indicator bar. A world-space bounding-circle prefilter, then
  the integer bounding box padded for anti-aliased edge pixels, decide;
- the background scan-fill, replaced by `Surface.fill` with the pixel value SDL_gfx writes, when SDL_gfx's
  integer scanline maths provably covers every surviving row (`_fill_covers_visible_rows`); else stock calls;
- the full-size flip: smoothscale is separable, so the world is X-shrunk unflipped and only 96-pixel rows flip;
- the font load (cached) and re-rendering an unchanged score string.

Vertex maths mirrors pygame-ce 2.5.8's `_vector2_rotate_helper` (src_c/math.c): the angle is reduced with fmod
to [0, 2*pi), multiples of pi/2 (within its epsilon 1e-6) are special-cased, sin/cos come from libm through
`math` (numpy's SIMD paths may differ in the last ulp), and gfxdraw truncates floats to int, then to Sint16.
"""

from __future__ import annotations

import math
import weakref

import numpy as np
import pygame
from gymnasium.envs.box2d import car_racing as cr
from pygame import gfxdraw

__all__ = ["render_state_pixels"]

W, H = cr.WINDOW_W, cr.WINDOW_H
STATE_SIZE = (cr.STATE_W, cr.STATE_H)
# Before the flip, rows [0, HIDDEN_ROWS) become the bottom rows that `_render_indicators` paints opaque black.
HIDDEN_ROWS = int(5 * H / 40.0)
# Anti-aliased edges touch at most one pixel beyond a polygon's integer bounding box.
AA_MARGIN = 2
# World-space prefilter slack in pixels: covers AA_MARGIN, int truncation and float rounding many times over.
PREFILTER_MARGIN = 16
_TWO_PI = 2.0 * math.pi
_HALF_PI = math.pi / 2.0
_VEC_EPSILON = 1e-6  # pygame-ce VECTOR_EPSILON
_MAX_TEXT_CACHE = 4096


def _grass_polygons() -> np.ndarray:
    """The 400 grass patches exactly as `_render_road` builds them (same float expressions)."""
    g = cr.GRASS_DIM
    grass = [
        [(g * x + g, g * y + 0), (g * x + 0, g * y + 0), (g * x + 0, g * y + g), (g * x + g, g * y + g)]
        for x in range(-20, 20, 2)
        for y in range(-20, 20, 2)
    ]
    return np.array(grass, dtype=np.float64)  # (400, 4, 2)


_GRASS = _grass_polygons()
_B = cr.PLAYFIELD
_FIELD = np.array([[(_B, _B), (_B, -_B), (-_B, -_B), (-_B, _B)]], dtype=np.float64)  # (1, 4, 2)


def _to_screen(polys: np.ndarray, zoom: float, trans: tuple[float, float], angle: float):
    """Float screen coordinates of `polys` (N, V, 2), as Vector2.rotate_rad then `c * zoom + trans` compute them."""
    a = math.fmod(angle, _TWO_PI)
    if a < 0:
        a += _TWO_PI
    x, y = polys[..., 0], polys[..., 1]  # (N, V)
    if math.fmod(a + _VEC_EPSILON, _HALF_PI) < 2 * _VEC_EPSILON:
        quarter = int((a + _VEC_EPSILON) / _HALF_PI) % 4
        rx, ry = ((x, y), (-y, x), (-x, -y), (y, -x))[quarter]
    else:
        s, c = math.sin(a), math.cos(a)
        rx = c * x - s * y
        ry = s * x + c * y
    return rx * zoom + trans[0], ry * zoom + trans[1]  # (N, V) each


def _to_sint16(v: np.ndarray) -> np.ndarray:
    """gfxdraw's conversion: PyNumber_Long (truncate toward zero), then a C cast to Sint16 (wraps)."""
    return ((v.astype(np.int64) + 32768) & 0xFFFF) - 32768


def _stock_keeps(sx: np.ndarray, sy: np.ndarray) -> np.ndarray:
    """`_draw_colored_polygon`'s cull: keep a polygon with any vertex inside the MAX_SHAPE_DIM-padded screen."""
    m = cr.MAX_SHAPE_DIM
    return ((sx >= -m) & (sx <= W + m) & (sy >= -m) & (sy <= H + m)).any(axis=1)


def _touches_output(ix: np.ndarray, iy: np.ndarray) -> np.ndarray:
    """Polygons whose integer bounding box (+AA margin) meets the surface rows that survive into the output."""
    return (
        (ix.max(axis=1) >= -AA_MARGIN)
        & (ix.min(axis=1) <= W - 1 + AA_MARGIN)
        & (iy.max(axis=1) >= HIDDEN_ROWS - AA_MARGIN)
        & (iy.min(axis=1) <= H - 1 + AA_MARGIN)
    )


def _round_fixed(v: int) -> int:
    """SDL_gfx's `(v >> 16) + ((v & 32768) >> 15)`: 16.16 fixed point to int, halves up; monotone in v."""
    return (v >> 16) + ((v & 32768) >> 15)


def _fill_covers_visible_rows(vx: list[int], vy: list[int]) -> bool:
    """True only if SDL_gfx's filledPolygon on these Sint16 vertices paints every pixel that reaches the output.

    filledPolygonColorMT (SDL_gfxPrimitives.c) fills, on each row y, between the sorted crossings
    v = ((65536 * (y - y1)) / (y2 - y1)) * (x2 - x1) + 65536 * x1 of the edges active on that row, from
    _round_fixed(v0 + 1) to _round_fixed(v1 - 1). Along one edge v is monotone in y and _round_fixed is monotone,
    so an edge's extreme crossings over a range of rows sit at the range's ends. We accept only the plain case:
    every surviving row has exactly two active edges, one crossing left of the surface on all its rows and one
    right of it, with |v| and its product term < 2**30 so neither the C int32 maths, the Sint16 casts nor
    qsort's subtracting comparator can overflow. Anything else answers False and the caller runs the stock calls.
    """
    lo, hi = HIDDEN_ROWS, H - 1
    if max(vy) <= hi:  # SDL_gfx's special last-row rule would apply to a surviving row
        return False
    left, right = [], []
    for i in range(len(vx)):
        x1, y1, x2, y2 = vx[i - 1], vy[i - 1], vx[i], vy[i]
        if y1 == y2:
            continue
        if y1 > y2:
            x1, y1, x2, y2 = x2, y2, x1, y1
        if y2 - y1 > 32767:
            return False
        a, b = max(y1, lo), min(y2 - 1, hi)  # surviving rows where this edge is active
        if a > b:
            continue
        steps = [((65536 * (y - y1)) // (y2 - y1)) * (x2 - x1) for y in (a, b)]  # monotone in y too
        ends = [step + 65536 * x1 for step in steps]
        if max(abs(v) for v in steps + ends) >= 2**30:
            return False
        if all(_round_fixed(v + 1) <= 0 for v in ends):
            left.append((a, b))
        elif all(_round_fixed(v - 1) >= W - 1 for v in ends):
            right.append((a, b))
        else:
            return False
    return _tiles(left, lo, hi) and _tiles(right, lo, hi)


def _tiles(intervals: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """Whether the closed integer intervals cover lo..hi exactly once each."""
    nxt = lo
    for a, b in sorted(intervals):
        if a != nxt:
            return False
        nxt = b + 1
    return nxt == hi + 1


class _Fonts:
    """The score font, loaded once instead of every frame, and rendered score strings by value.

    Dropped whenever pygame.font was shut down (pygame.quit(), or found uninitialised at the next frame).
    """

    font: pygame.font.Font | None = None
    texts: dict[str, pygame.Surface] = {}

    @classmethod
    def reset(cls) -> None:
        cls.font = None
        cls.texts = {}

    @classmethod
    def text(cls, s: str) -> pygame.Surface:
        surf = cls.texts.get(s)
        if surf is None:
            if cls.font is None:
                cls.font = pygame.font.Font(pygame.font.get_default_font(), 42)
                pygame.register_quit(cls.reset)  # pygame.quit() empties its list, so register per font
            if len(cls.texts) >= _MAX_TEXT_CACHE:
                cls.texts.clear()
            surf = cls.texts[s] = cls.font.render(s, True, (255, 255, 255), (0, 0, 0))
        return surf


class _EnvCache:
    """Per-env reusable surfaces and per-episode geometry (grass then road polygons, stock draw order)."""

    def __init__(self) -> None:
        self.road_poly: list | None = None
        self.polys = _GRASS
        self.display: pygame.Surface | None = None
        self.canvas: pygame.Surface | None = None

    def geometry(self, env) -> np.ndarray:
        road = env.road_poly
        if road is not self.road_poly or len(road) != len(self.polys) - len(_GRASS):
            verts = np.array([[(p[0], p[1]) for p in poly] for poly, _ in road], dtype=np.float64).reshape(-1, 4, 2)
            self.polys = np.concatenate([_GRASS, verts])  # (400 + P, 4, 2)
            self.centres = self.polys.mean(axis=1)  # (N, 2)
            self.radii = np.linalg.norm(self.polys - self.centres[:, None], axis=2).max(axis=1)  # (N,)
            self.road_poly = road
        return self.polys

    def near_view(self, zoom: float, trans, angle: float) -> np.ndarray:
        """Indices of polygons whose bounding circle comes within PREFILTER_MARGIN px of the surviving rows.

        A cheap superset of what `_touches_output` keeps: the exact, per-vertex test runs on these only.
        """
        cx, cy = (W - 1) / 2 - trans[0], (HIDDEN_ROWS + H - 1) / 2 - trans[1]
        c, s = math.cos(angle), math.sin(angle)
        world = np.array([c * cx + s * cy, -s * cx + c * cy]) / zoom  # (2,) view centre, world units
        reach_px = math.hypot(W / 2 + PREFILTER_MARGIN, (H - HIDDEN_ROWS) / 2 + PREFILTER_MARGIN)
        d = self.centres - world  # (N, 2)
        reach = self.radii + reach_px / zoom  # (N,)
        return np.flatnonzero(d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1] <= reach * reach)

    def surfaces(self) -> None:
        """(Re)make the work surfaces in the format `pygame.Surface((W, H))` gives right now."""
        display = pygame.display.get_surface()
        if self.canvas is not None and display is self.display:
            return
        # pygame-ce takes a new Surface's format from the display surface when one exists.
        self.display = display
        self.canvas = pygame.Surface((W, H))  # the world, before the vertical flip
        self.bar = pygame.Surface((W, H))  # becomes env.surf; only its indicator rows are drawn
        self.probe = pygame.Surface((4, 4))
        n_vis = H - HIDDEN_ROWS
        self.canvas_vis = self.canvas.subsurface((0, HIDDEN_ROWS, W, n_vis))
        self.bar_vis = self.bar.subsurface((0, n_vis, W, HIDDEN_ROWS))
        self.world_x = pygame.Surface((cr.STATE_W, n_vis), 0, self.canvas)
        self.bar_x = pygame.Surface((cr.STATE_W, HIDDEN_ROWS), 0, self.canvas)
        self.frame_x = pygame.Surface((cr.STATE_W, H), 0, self.canvas)
        self.small = pygame.Surface(STATE_SIZE, 0, self.canvas)

    def mapped(self, color) -> int:
        """The pixel value SDL_gfx's filled polygon writes for `color` on the canvas format."""
        gfxdraw.filled_polygon(self.probe, [(0, 0), (3, 0), (3, 3), (0, 3)], color)
        return self.probe.get_at_mapped((1, 1))


_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _draw_world(surf: pygame.Surface, env, cache: _EnvCache, zoom: float, trans, angle: float) -> None:
    """Background, grass and road, as `CarRacing._render_road` draws them, minus provably invisible work."""
    fx, fy = _to_screen(_FIELD, zoom, trans, angle)
    vx, vy = _to_sint16(fx[0]).tolist(), _to_sint16(fy[0]).tolist()
    if _fill_covers_visible_rows(vx, vy):
        surf.fill(cache.mapped(env.bg_color), (0, HIDDEN_ROWS, W, H - HIDDEN_ROWS))
    else:
        surf.fill(0)  # a fresh pygame.Surface is zeroed
        field = list(zip(vx, vy, strict=True))
        gfxdraw.aapolygon(surf, field, env.bg_color)
        gfxdraw.filled_polygon(surf, field, env.bg_color)

    polys = cache.geometry(env)
    near = cache.near_view(zoom, trans, angle)
    sx, sy = _to_screen(polys[near], zoom, trans, angle)  # (n, 4) each
    ix, iy = _to_sint16(sx), _to_sint16(sy)
    ok = np.flatnonzero(_stock_keeps(sx, sy) & _touches_output(ix, iy))
    keep, ix, iy = near[ok], ix[ok], iy[ok]
    points = np.stack([ix, iy], axis=-1).tolist()  # (K, 4, 2) nested lists
    n_grass = len(_GRASS)
    road_poly = env.road_poly
    grass_color = env.grass_color
    for i, pts in zip(keep.tolist(), points, strict=True):
        color = grass_color if i < n_grass else [int(c) for c in road_poly[i - n_grass][1]]
        gfxdraw.aapolygon(surf, pts, color)
        gfxdraw.filled_polygon(surf, pts, color)


def render_state_pixels(env) -> np.ndarray:
    """The (96, 96, 3) uint8 frame stock `env._render("state_pixels")` returns, bit for bit, only faster.

    `env` is the unwrapped gymnasium CarRacing after `reset()`. Like stock rendering it initialises pygame.font
    and creates `env.clock` if missing. `env.surf` is left holding a 1000x800 surface like stock's, but only its
    indicator bar (the bottom 100 rows) is drawn: the full-size flipped world is never assembled, because
    smoothscale is separable (an X pass per row, then a Y pass), so the world is X-shrunk unflipped and the
    small 96-column result is flipped instead. Nothing else on the env is touched.
    """
    if "t" not in env.__dict__ or getattr(env, "car", None) is None:
        raise ValueError("render_state_pixels: env has no track or car yet; call env.reset() first")
    if not pygame.font.get_init():
        _Fonts.reset()  # a font object must not outlive TTF_Quit
        pygame.font.init()
    if env.clock is None:
        env.clock = pygame.time.Clock()
    cache = _CACHES.get(env)
    if cache is None:
        cache = _CACHES[env] = _EnvCache()
    cache.surfaces()

    angle = -env.car.hull.angle
    zoom = 0.1 * cr.SCALE * max(1 - env.t, 0) + cr.ZOOM * cr.SCALE * min(env.t, 1)
    scroll_x = -(env.car.hull.position[0]) * zoom
    scroll_y = -(env.car.hull.position[1]) * zoom
    trans = pygame.math.Vector2((scroll_x, scroll_y)).rotate_rad(angle)
    trans = (W / 2 + trans[0], H / 4 + trans[1])

    _draw_world(cache.canvas, env, cache, zoom, trans, angle)
    env.car.draw(cache.canvas, zoom, trans, angle, False)

    # Stock: flip, paint the bar over rows H-100.. (opaque: rows 0..99 of the unflipped world never show),
    # smoothscale. Same pixels: X-shrink the surviving world rows, flip those 96-wide rows, stack the X-shrunk
    # bar under them, then let smoothscale's Y pass (X untouched at equal width) finish the frame.
    env.surf = cache.bar
    env._render_indicators(W, H)
    text = _Fonts.text(f"{env.reward:04.0f}")
    text_rect = text.get_rect()
    text_rect.center = (60, H - H * 2.5 / 40.0)
    env.surf.blit(text, text_rect)

    pygame.transform.smoothscale(cache.canvas_vis, cache.world_x.get_size(), cache.world_x)
    pygame.transform.smoothscale(cache.bar_vis, cache.bar_x.get_size(), cache.bar_x)
    cache.frame_x.blit(pygame.transform.flip(cache.world_x, False, True), (0, 0))
    cache.frame_x.blit(cache.bar_x, (0, H - HIDDEN_ROWS))
    pygame.transform.smoothscale(cache.frame_x, STATE_SIZE, cache.small)
    rgb = pygame.image.tobytes(cache.small, "RGB")
    return np.frombuffer(rgb, dtype=np.uint8).reshape(cr.STATE_H, cr.STATE_W, 3).copy()
