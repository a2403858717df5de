"""Per-frame screen geometry of `sim_bridges.carracing.fast_render` in numba: the same float maths as the numpy
reference in `sim_bridges.carracing.render_geometry`, step for step, without numpy's per-call overhead.

- `visible_polygons`: rotate, zoom and translate every grass and road polygon (no world-space prefilter: 700
  polygons x 4 vertices cost ~3 us here), stock's MAX_SHAPE_DIM cull, the Sint16 conversion, and the bounding-box
  test against the surviving rows, writing the kept ones in draw order.
- `car_polygons`: pybox2d's float32 ``transform * v`` for every car fixture and wheel stripe, then the same view
  maths, truncated to int like pygame.
- `fill_covers`: `render_geometry.fill_covers_visible_rows` on int64 (every intermediate stays below 2**48).

Each is one IEEE operation per numpy operation of the reference, in the same order (numba neither fuses a multiply
and an add nor reorders float maths without fastmath); tests compare both on random inputs. Measured per frame
(this 2-core machine): the numpy/Python versions took ~0.15 ms (culling, vertex maths) + ~0.2 ms (car) + ~0.04 ms
(background cover test); these ~0.02 ms together.
"""

from __future__ import annotations

import math
import weakref

import numpy as np
from gymnasium.envs.box2d import car_dynamics as cd
from numba import njit

from sim_bridges.carracing.render_geometry import AA_MARGIN, HIDDEN_ROWS, H, W

_TWO_PI = 2.0 * math.pi
_HALF_PI = math.pi / 2.0
_VEC_EPSILON = 1e-6  # pygame-ce VECTOR_EPSILON


def rotation(angle: float) -> tuple[int, float, float]:
    """Vector2.rotate_rad's case split for `angle`: (quarter, cos, sin), quarter -1 unless a multiple of pi/2."""
    a = math.fmod(angle, _TWO_PI)
    if a < 0:
        a += _TWO_PI
    if math.fmod(a + _VEC_EPSILON, _HALF_PI) < 2 * _VEC_EPSILON:
        return int((a + _VEC_EPSILON) / _HALF_PI) % 4, 1.0, 0.0
    return -1, math.cos(a), math.sin(a)


@njit(cache=True)
def _screen(x, y, quarter, c, s, zoom, tx, ty):
    if quarter == 0:
        rx, ry = x, y
    elif quarter == 1:
        rx, ry = -y, x
    elif quarter == 2:
        rx, ry = -x, -y
    elif quarter == 3:
        rx, ry = y, -x
    else:
        rx = c * x - s * y
        ry = s * x + c * y
    return rx * zoom + tx, ry * zoom + ty


@njit(cache=True)
def _sint16(v):
    return ((np.int64(v) + 32768) & 0xFFFF) - 32768


@njit(cache=True)
def visible_polygons(polys, quarter, c, s, zoom, tx, ty, shape_dim, cull, keep, ix, iy):
    """Screen vertices of polys (N, V, 2): Sint16 ix, iy (K, V) and indices keep (K,) of those stock draws and that
    reach the surviving rows (all of them if not `cull`), in order; returns K."""
    m = shape_dim
    k = 0
    for i in range(polys.shape[0]):
        inside = False
        x_lo = y_lo = 1 << 40
        x_hi = y_hi = -(1 << 40)
        for v in range(polys.shape[1]):
            sx, sy = _screen(polys[i, v, 0], polys[i, v, 1], quarter, c, s, zoom, tx, ty)
            inside |= sx >= -m and sx <= W + m and sy >= -m and sy <= H + m
            xi, yi = _sint16(sx), _sint16(sy)
            ix[k, v], iy[k, v] = xi, yi
            x_lo, x_hi, y_lo, y_hi = min(x_lo, xi), max(x_hi, xi), min(y_lo, yi), max(y_hi, yi)
        touches = x_hi >= -AA_MARGIN and x_lo <= W - 1 + AA_MARGIN
        touches &= y_hi >= HIDDEN_ROWS - AA_MARGIN and y_lo <= H - 1 + AA_MARGIN
        if not cull or (inside and touches):
            keep[k] = i
            k += 1
    return k


@njit(cache=True)
def car_polygons(
    local,
    body_of,
    counts,
    colours,
    poses,
    stripes,
    stripe_w,
    stripe_colour,
    quarter,
    c,
    s,
    zoom,
    tx,
    ty,
    px,
    py,
    n_out,
    col_out,
):
    """`Car.draw(..., draw_particles=False)`'s polygons: fixture k's local float32 vertices local[k, :counts[k]]
    through its body's pose (c, s, x, y) as pybox2d's float32 b2Mul, then, for a body with stripes[b, 0] set, its
    wheel stripe (-w, r1), (w, r1), (w, r2), (-w, r2) after each of its fixtures. Int vertices into px, py
    (P, 8), counts into n_out, colours into col_out; returns P, or -1 where a vertex leaves [0, 2**30)
    (pygame's int conversion is then not plain truncation: the caller falls back)."""
    p = 0
    w = np.float32(stripe_w)
    for k in range(local.shape[0]):
        b = body_of[k]
        qc, qs, bx, by = poses[b, 0], poses[b, 1], poses[b, 2], poses[b, 3]
        for rep in range(2):
            if rep == 0:
                n, col = counts[k], colours[k]
            elif stripes[b, 0] != 0.0:
                n, col = 4, stripe_colour
            else:
                break
            for v in range(n):
                if rep == 0:
                    x, y = local[k, v, 0], local[k, v, 1]
                else:
                    x = w if v == 1 or v == 2 else -w
                    y = np.float32(stripes[b, 1] if v < 2 else stripes[b, 2])
                wx = (qc * x - qs * y) + bx  # float32 throughout
                wy = (qs * x + qc * y) + by
                sx, sy = _screen(np.float64(wx), np.float64(wy), quarter, c, s, zoom, tx, ty)
                if not (sx >= 0 and sy >= 0 and sx < 1 << 30 and sy < 1 << 30):
                    return -1
                px[p, v], py[p, v] = np.int64(sx), np.int64(sy)
            for v in range(n, px.shape[1]):
                px[p, v], py[p, v] = px[p, n - 1], py[p, n - 1]
            n_out[p], col_out[p] = n, col
            p += 1
    return p


@njit(cache=True)
def _round_fixed(v):
    return (v >> 16) + ((v & 32768) >> 15)


@njit(cache=True)
def fill_covers(vx, vy):
    """`render_geometry.fill_covers_visible_rows` (see there) on int64 Sint16 vertices."""
    lo, hi = HIDDEN_ROWS, H - 1
    if vy.max() <= hi:
        return False
    n = vx.shape[0]
    ends = np.empty((2, n, 2), np.int64)  # (left/right, edge, (a, b))
    n_side = np.zeros(2, np.int64)
    for i in range(n):
        i1 = i - 1 if i > 0 else n - 1
        x1, y1, x2, y2 = vx[i1], vy[i1], vx[i], vy[i]
        if y1 == y2:
            continue
        if y1 > y2:
            x1, y1, x2, y2 = x2, y2, x1, y1
        if y2 - y1 > 32767:
            return False
        a, b = max(y1, lo), min(y2 - 1, hi)
        if a > b:
            continue
        left = right = True
        for y in (a, b):
            step = ((65536 * (y - y1)) // (y2 - y1)) * (x2 - x1)
            end = step + 65536 * x1
            if abs(step) >= 1 << 30 or abs(end) >= 1 << 30:
                return False
            left &= _round_fixed(end + 1) <= 0
            right &= _round_fixed(end - 1) >= W - 1
        side = 0 if left else 1
        if not left and not right:
            return False
        ends[side, n_side[side], 0], ends[side, n_side[side], 1] = a, b
        n_side[side] += 1
    for side in range(2):
        m = n_side[side]
        order = np.argsort(ends[side, :m, 0], kind="mergesort")
        nxt = lo
        for t in order:
            if ends[side, t, 0] != nxt:
                return False
            nxt = ends[side, t, 1] + 1
        if nxt != hi + 1:
            return False
    return True


class CarShapes:
    """Per car: its drawlist's fixtures in draw order as local float32 outlines padded to 8 vertices (Box2D's
    maximum), their bodies, vertex counts and 0xRRGGBB colours -- fixed for a car's life -- plus work buffers."""

    def __init__(self, car) -> None:
        local, body_of, counts, colours = [], [], [], []
        self.bodies = list(car.drawlist)
        for b, obj in enumerate(self.bodies):
            rgb = [int(c * 255) for c in obj.color]
            for f in obj.fixtures:
                assert f.body == obj, "Car.draw transforms by each fixture's body: the body itself here"
                v = list(f.shape.vertices)
                local.append(np.array(v + v[-1:] * (8 - len(v)), np.float32))
                body_of.append(b)
                counts.append(len(v))
                colours.append((rgb[0] << 16) | (rgb[1] << 8) | rgb[2])
        self.local, self.body_of = np.stack(local), np.array(body_of, np.int64)  # (P, 8, 2), (P,)
        self.counts, self.colours = np.array(counts, np.int64), np.array(colours, np.int64)
        self.quads = min(counts, default=0) >= 4  # pygame special-cases triangles (CarRacing has none)
        self.poses = np.zeros((len(self.bodies), 4), np.float32)  # per body (q.c, q.s, x, y)
        self.stripes = np.zeros((len(self.bodies), 3))  # per body (drawn, r1, r2)
        n_max = 2 * len(local)
        self.px, self.py = np.zeros((n_max, 8), np.int64), np.zeros((n_max, 8), np.int64)
        self.n_out, self.col_out = np.zeros(n_max, np.int64), np.zeros(n_max, np.int64)


_CAR_SHAPES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_STRIPE_W = cd.WHEEL_W * cd.SIZE
_WHEEL_WHITE = (cd.WHEEL_WHITE[0] << 16) | (cd.WHEEL_WHITE[1] << 8) | cd.WHEEL_WHITE[2]


def car_screen(car, zoom: float, trans, rot: tuple[int, float, float]):
    """Int screen vertices (P, 8) x and y, vertex counts (P,) and 0xRRGGBB colours (P,) of the polygons
    `Car.draw(..., draw_particles=False)` fills, in its order and with its float maths (gymnasium 1.4.0
    car_dynamics.py); `rot` from `rotation(angle)`. None where pygame's int conversion is not plain truncation
    or a polygon is a triangle (pygame special-cases those; CarRacing has none)."""
    shapes = _CAR_SHAPES.get(car)
    if shapes is None:
        shapes = _CAR_SHAPES[car] = CarShapes(car)
    if not shapes.quads:
        return None
    poses, stripes = shapes.poses, shapes.stripes
    for b, obj in enumerate(shapes.bodies):
        t = obj.transform
        q, p = t.q, t.position
        poses[b] = q.c, q.s, p[0], p[1]
        stripes[b, 0] = 0.0
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
        stripes[b] = 1.0, cd.WHEEL_R * c1 * cd.SIZE, cd.WHEEL_R * c2 * cd.SIZE
    n = car_polygons(
        shapes.local,
        shapes.body_of,
        shapes.counts,
        shapes.colours,
        poses,
        stripes,
        _STRIPE_W,
        _WHEEL_WHITE,
        *rot,
        zoom,
        trans[0],
        trans[1],
        shapes.px,
        shapes.py,
        shapes.n_out,
        shapes.col_out,
    )
    if n < 0:
        return None
    return shapes.px[:n], shapes.py[:n], shapes.n_out[:n], shapes.col_out[:n]
