"""Screen geometry shared by both CarRacing renderers in `sim_bridges.carracing.fast_render`: stock's polygons and
vertex maths, its culling, and what of the 1000x800 surface survives into the 96x96 frame.

Vertex maths mirrors pygame-ce 2.5.8's `_vector2_rotate_helper` (src_c/math.c): the angle is reduced with fmod
to [0, 2*pi), multiples of pi/2 (within its epsilon 1e-6) are special-cased, sin/cos come from libm through
`math` (numpy's SIMD paths may differ in the last ulp), and gfxdraw truncates floats to int, then to Sint16.

The per-frame path runs the numba twins of `to_screen`, `stock_keeps`, `touches_output`, `car_screen` and
`fill_covers_visible_rows` in `sim_bridges.carracing.view` (numpy's per-call overhead was ~0.35 ms a frame); these numpy
versions stay as the readable reference the tests hold the kernels to.
"""

from __future__ import annotations

import math
import weakref

import numpy as np
from gymnasium.envs.box2d import car_dynamics as cd
from gymnasium.envs.box2d import car_racing as cr

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


def grass_polygons() -> np.ndarray:
    """The 400 grass patches exactly as `_render_road` builds them (same float expressions)."""
    g = cr.GRASS_DIM
    grass = [
        [(g * x + g, g * y + 0), (g * x + 0, g * y + 0), (g * x + 0, g * y + g), (g * x + g, g * y + g)]
        for x in range(-20, 20, 2)
        for y in range(-20, 20, 2)
    ]
    return np.array(grass, dtype=np.float64)  # (400, 4, 2)


GRASS = grass_polygons()
_B = cr.PLAYFIELD
FIELD = np.array([[(_B, _B), (_B, -_B), (-_B, -_B), (-_B, _B)]], dtype=np.float64)  # (1, 4, 2)


def to_screen(polys: np.ndarray, zoom: float, trans: tuple[float, float], angle: float):
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


def to_sint16(v: np.ndarray) -> np.ndarray:
    """gfxdraw's conversion: PyNumber_Long (truncate toward zero), then a C cast to Sint16 (wraps)."""
    return ((v.astype(np.int64) + 32768) & 0xFFFF) - 32768


def stock_keeps(sx: np.ndarray, sy: np.ndarray) -> np.ndarray:
    """`_draw_colored_polygon`'s cull: keep a polygon with any vertex inside the MAX_SHAPE_DIM-padded screen."""
    m = cr.MAX_SHAPE_DIM
    return ((sx >= -m) & (sx <= W + m) & (sy >= -m) & (sy <= H + m)).any(axis=1)


def touches_output(ix: np.ndarray, iy: np.ndarray) -> np.ndarray:
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


def fill_covers_visible_rows(vx: list[int], vy: list[int]) -> bool:
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


_CAR_SHAPES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_WHEEL_WHITE = (cd.WHEEL_WHITE[0] << 16) | (cd.WHEEL_WHITE[1] << 8) | cd.WHEEL_WHITE[2]


def _car_shapes(car) -> list:
    """Per body of `car.drawlist`: the body, and per fixture its outline padded to 8 vertices by repeating the last
    (8, 2) float32, its vertex count and 0xRRGGBB colour. Fixed for a car's life, so read through Box2D once."""
    shapes = []
    for obj in car.drawlist:
        rgb = [int(c * 255) for c in obj.color]
        outlines = []
        for f in obj.fixtures:
            assert f.body == obj, "Car.draw transforms by each fixture's body: the body itself here"
            v = list(f.shape.vertices)  # Box2D polygons have at most 8 (b2_maxPolygonVertices)
            outlines.append(
                (np.array(v + v[-1:] * (8 - len(v)), np.float32), len(v), (rgb[0] << 16) | (rgb[1] << 8) | rgb[2])
            )
        shapes.append((obj, outlines))
    return shapes


def car_screen(car, zoom: float, trans, angle: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Integer screen vertices (P, 8) x and y, vertex counts (P,) and 0xRRGGBB colours (P,) of the polygons
    `Car.draw(..., draw_particles=False)` fills, in its order and with its float maths (gymnasium 1.4.0
    car_dynamics.py): pybox2d's `transform * v` is b2Mul in float32, then Vector2.rotate_rad as `to_screen`.
    None outside the range where pygame's float-to-int conversion is plain truncation (never for the car)."""
    shapes = _CAR_SHAPES.get(car)
    if shapes is None:
        shapes = _CAR_SHAPES[car] = _car_shapes(car)
    local, pose, counts, colours = [], [], [], []
    for obj, outlines in shapes:
        t = obj.transform
        q = (t.q.c, t.q.s, *t.position)
        for verts, n, colour in outlines:
            local.append(verts)
            pose.append(q)
            counts.append(n)
            colours.append(colour)
            if "phase" not in obj.__dict__:
                continue
            a1, a2 = obj.phase, obj.phase + 1.2
            s1, s2, c1, c2 = math.sin(a1), math.sin(a2), math.cos(a1), math.cos(a2)
            if s1 > 0 and s2 > 0:
                continue
            if s1 > 0:
                c1 = np.sign(c1)
            if s2 > 0:
                c2 = np.sign(c2)
            w, r1, r2 = cd.WHEEL_W * cd.SIZE, cd.WHEEL_R * c1 * cd.SIZE, cd.WHEEL_R * c2 * cd.SIZE
            local.append(np.array([(-w, r1), (w, r1), (w, r2), (-w, r2)] + [(-w, r2)] * 4, np.float32))
            pose.append(q)
            counts.append(4)
            colours.append(_WHEEL_WHITE)
    if min(counts) < 4:  # pygame special-cases triangles; CarRacing has none
        return None
    verts = np.stack(local)  # (P, 8, 2) float32
    c, s, px, py = np.array(pose, np.float32).T[..., None]  # (P, 1) each
    x, y = verts[..., 0], verts[..., 1]
    world = np.stack([(c * x - s * y) + px, (s * x + c * y) + py], axis=-1)  # (P, 8, 2) float32
    sx, sy = to_screen(world.astype(np.float64), zoom, trans, angle)  # (P, 8) each
    if min(sx.min(), sy.min()) < 0 or max(sx.max(), sy.max()) >= 1 << 30:
        return None
    return sx.astype(np.int64), sy.astype(np.int64), np.array(counts), np.array(colours, np.int64)
