"""pygame-ce 2.5.8's `pygame.draw.polygon` fill (src_c/draw.c `draw_fillpoly`), exact, onto
`sim_bridges.carracing.raster`'s tiled canvas: how `Car.draw` paints the car body, wheels and wheel stripes (opaque, no
anti-aliasing).

Per row, float32 crossings ``(y-y1)*(x2-x1)/(float)(y2-y1)`` floored or ceiled by the parity of their index
(before sorting), the ``y == maxy`` rule, a one-row polygon as one run, then the horizontal edges strictly inside
the row range. Matched by test against pygame.draw.polygon on random 4- to 8-gons; the integer-division variant
of older pygame releases matched 2 % of them.

The vertices come from `sim_bridges.carracing.render_geometry.car_screen`, already truncated to int like pygame does.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim_bridges.carracing.raster import H, apply_ops, clip_run


@njit(cache=True)
def _poly_runs(vx, vy, c, hidden, ops, n_ops, ints):
    """pygame-ce 2.5.8 `draw_fillpoly`'s runs, queued on ops: per row the crossings ``(y-y1)*(x2-x1)/(float)(y2-y1)``
    in float32, floored or ceiled by the parity of their index before sorting; the ``y == maxy`` rule; a one-row
    polygon as one run; then the horizontal edges strictly between the extreme rows."""
    n = vx.shape[0]
    miny, maxy = vy.min(), vy.max()
    if miny == maxy:
        ok, xa, xb = clip_run(miny, vx.min(), vx.max(), hidden)
        if ok:
            ops[n_ops, 0], ops[n_ops, 1], ops[n_ops, 2], ops[n_ops, 3], ops[n_ops, 4] = miny, xa, xb, c, 255
            n_ops += 1
        return n_ops
    for y in range(max(miny, hidden), min(maxy, H - 1) + 1):
        k = 0
        for i in range(n):
            ip = i - 1 if i > 0 else n - 1
            y1, y2 = vy[ip], vy[i]
            if y1 < y2:
                x1, x2 = vx[ip], vx[i]
            elif y1 > y2:
                y1, y2, x1, x2 = vy[i], vy[ip], vx[i], vx[ip]
            else:
                continue
            if (y >= y1 and y < y2) or (y == maxy and y2 == maxy):
                t = np.float32((y - y1) * (x2 - x1)) / np.float32(y2 - y1)
                ints[k] = int(np.floor(t) if k % 2 == 0 else np.ceil(t)) + x1
                k += 1
        for i in range(1, k):
            v, m = ints[i], i - 1
            while m >= 0 and ints[m] > v:
                ints[m + 1] = ints[m]
                m -= 1
            ints[m + 1] = v
        for i in range(0, k - 1, 2):
            ok, xa, xb = clip_run(y, ints[i], ints[i + 1], hidden)
            if ok:
                ops[n_ops, 0], ops[n_ops, 1], ops[n_ops, 2], ops[n_ops, 3], ops[n_ops, 4] = y, xa, xb, c, 255
                n_ops += 1
    for i in range(n):
        ip = i - 1 if i > 0 else n - 1
        y = vy[i]
        if miny < y < maxy and vy[ip] == y:
            ok, xa, xb = clip_run(y, vx[i], vx[ip], hidden)
            if ok:
                ops[n_ops, 0], ops[n_ops, 1], ops[n_ops, 2], ops[n_ops, 3], ops[n_ops, 4] = y, xa, xb, c, 255
                n_ops += 1
    return n_ops


@njit(cache=True)
def draw_car(polys_x, polys_y, counts, colours, cv):
    """pygame.draw.polygon (filled, opaque) of each polygon k: its first counts[k] int vertices, in order.
    False (nothing drawn) where the canvas's pool could overflow."""
    ops = np.empty((polys_x.shape[0] * (2 * H + polys_x.shape[1]), 5), np.int64)
    ints = np.empty(polys_x.shape[1], np.int64)
    n_ops = 0
    for k in range(polys_x.shape[0]):
        m = counts[k]
        n_ops = _poly_runs(polys_x[k, :m], polys_y[k, :m], colours[k], cv[0], ops, n_ops, ints)
    return apply_ops(ops, n_ops, cv)
