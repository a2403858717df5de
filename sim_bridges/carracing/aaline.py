"""SDL_gfx's anti-aliased line as `aapolygonColor` draws each edge (`_aalineColor(..., draw_endpoint=0)`), exact,
in numba: its pixel writes in order, for `sim_bridges.carracing.raster` to paint.

Cohen-Sutherland clipping to the 1000x800 surface with a float32 slope and Sint16 results (`_clipLine`); vertical and
horizontal lines as opaque runs including both ends; else Wu's line: the first (clipped, not reordered) point opaque,
then a 32-bit error accumulator whose top byte weights each pixel pair (alpha ``(255*weight)>>8``). Inputs are int64
vertices the caller has checked to lie within +-4096 (`raster.poly_in_range`), where int64 and SDL_gfx's int32 agree.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim_bridges.carracing.render_geometry import H, W

_LEFT, _RIGHT, _BOTTOM, _TOP = 1, 2, 4, 8


@njit(cache=True)
def _wrap16(v):
    return ((v + 32768) & 0xFFFF) - 32768


@njit(cache=True)
def _encode(x, y):
    code = 0
    if x < 0:
        code |= _LEFT
    elif x > W - 1:
        code |= _RIGHT
    if y < 0:
        code |= _TOP
    elif y > H - 1:
        code |= _BOTTOM
    return code


@njit(cache=True)
def _clip_line(x1, y1, x2, y2):
    """SDL_gfx `_clipLine` (float32 slope, Sint16 results); returns (draw, x1, y1, x2, y2)."""
    while True:
        c1, c2 = _encode(x1, y1), _encode(x2, y2)
        if (c1 | c2) == 0:
            return True, x1, y1, x2, y2
        if c1 & c2:
            return False, x1, y1, x2, y2
        if c1 == 0:
            x1, x2 = x2, x1
            y1, y2 = y2, y1
            c1, c2 = c2, c1
        if x2 != x1:
            m = np.float32(y2 - y1) / np.float32(x2 - x1)
        else:
            m = np.float32(1.0)
        if c1 & _LEFT:
            y1 = _wrap16(y1 + _wrap16(int(np.float32(0 - x1) * m)))
            x1 = 0
        elif c1 & _RIGHT:
            y1 = _wrap16(y1 + _wrap16(int(np.float32(W - 1 - x1) * m)))
            x1 = W - 1
        elif c1 & _BOTTOM:
            if x2 != x1:
                x1 = _wrap16(x1 + _wrap16(int(np.float32(H - 1 - y1) / m)))
            y1 = H - 1
        elif c1 & _TOP:
            if x2 != x1:
                x1 = _wrap16(x1 + _wrap16(int(np.float32(0 - y1) / m)))
            y1 = 0


@njit(cache=True)
def aaline(x1, y1, x2, y2, ops):
    """`_aalineColor(dst, x1, y1, x2, y2, color, draw_endpoint=0)`: its pixel writes, in order, as rows
    (x, y, alpha) of `ops` (alpha 255: opaque); returns how many."""
    ok, x1, y1, x2, y2 = _clip_line(x1, y1, x2, y2)
    if not ok:
        return 0
    xx0, yy0, xx1, yy1 = x1, y1, x2, y2
    if yy0 > yy1:
        xx0, yy0, xx1, yy1 = xx1, yy1, xx0, yy0
    dx, dy = xx1 - xx0, yy1 - yy0
    n = 0
    if dx == 0:  # vlineColor(x1, yy0, yy0 + dy), or pixelColor(x1, y1)
        for y in range(yy0, yy0 + dy + 1):
            ops[n, 0], ops[n, 1], ops[n, 2] = x1, y, 255
            n += 1
        return n
    if dy == 0:  # hlineColor(xx0, xx0 + dx, y1): both ends
        for x in range(min(xx0, xx0 + dx), max(xx0, xx0 + dx) + 1):
            ops[n, 0], ops[n, 1], ops[n, 2] = x, y1, 255
            n += 1
        return n
    xdir = 1
    if dx < 0:
        xdir, dx = -1, -dx
    ops[0, 0], ops[0, 1], ops[0, 2] = x1, y1, 255
    n = 1
    erracc = 0
    if dy > dx:
        erradj = (((dx << 16) // dy) << 16) & 0xFFFFFFFF
        x0pxdir = xx0 + xdir
        for _ in range(dy - 1):
            tmp = erracc
            erracc = (erracc + erradj) & 0xFFFFFFFF
            if erracc <= tmp:
                xx0 = x0pxdir
                x0pxdir += xdir
            yy0 += 1
            wgt = (erracc >> 24) & 255
            ops[n, 0], ops[n, 1], ops[n, 2] = xx0, yy0, (255 * (255 - wgt)) >> 8
            ops[n + 1, 0], ops[n + 1, 1], ops[n + 1, 2] = x0pxdir, yy0, (255 * wgt) >> 8
            n += 2
    else:
        erradj = (((dy << 16) // dx) << 16) & 0xFFFFFFFF
        y0p1 = yy0 + 1
        for _ in range(dx - 1):
            tmp = erracc
            erracc = (erracc + erradj) & 0xFFFFFFFF
            if erracc <= tmp:
                yy0 = y0p1
                y0p1 += 1
            xx0 += xdir
            wgt = (erracc >> 24) & 255
            ops[n, 0], ops[n, 1], ops[n, 2] = xx0, yy0, (255 * (255 - wgt)) >> 8
            ops[n + 1, 0], ops[n + 1, 1], ops[n + 1, 2] = xx0, y0p1, (255 * wgt) >> 8
            n += 2
    return n
