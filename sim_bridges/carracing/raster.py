"""Exact integer re-implementations, in numba, of the pygame-ce 2.5.8 / SDL_gfx drawing behind CarRacing's frame.

`sim_bridges.carracing.fast_render` draws the world (background, grass, road) with these kernels, and the car with
`sim_bridges.carracing.raster_car`, instead of on a 1000x800 pygame surface, keeping only what reaches the 96x96
`state_pixels` frame. What each copies:

- `filledPolygonColorMT` (src_c/SDL_gfx/SDL_gfxPrimitives.c): per row, 16.16 fixed-point edge crossings
  ``((65536*(y-y1))/(y2-y1))*(x2-x1)+65536*x1`` with the ``y == maxy`` rule, sorted, filled pairwise from
  ``round(v0+1)`` to ``round(v1-1)`` by `hlineColor`, which swaps reversed ends (a crossing pair closer than a
  pixel still paints one or two) and clips to the surface.
- `aapolygonColor`: `_aalineColor(..., draw_endpoint=0)` per edge (its pixels and weights:
  `sim_bridges.carracing.aaline`), each pixel blended by `_putPixelAlpha` with alpha ``(255*weight)>>8`` as ``d + (((c -
  d) * alpha) >> 8)`` per channel (arithmetic shift: C's Uint32 wrap-around gives the same bits).

Layout. Rows above `hidden` (under the indicator bar after the flip) are never stored. Each surviving row is cut
into the 96 (+1 trailing) *tiles* smoothscale's X pass folds into one output pixel each
(`sim_bridges.carracing.shrink`). A tile is one colour, stored once, or its pixels sit in a pool slot. A scanline run
sets whole tiles in O(1) and writes pixels only in its two end tiles; an anti-aliased pixel moves its tile to the pool.
Outline pixels the same polygon's fill covers next are never drawn: nothing reads them in between. Most tiles of a frame
stay one colour. Why this layout (each choice kept because it was faster on recorded frames; `drive bench render
--breakdown` times the kernel as it is now):

- a dense 1000-wide canvas: anti-aliased lines step to a new row at every pixel and missed the cache each time;
  pool slots are handed out in order, so touched tiles lie together;
- numba helpers that take arrays cost reference counting at every call, inlined (``inline="always"``) or not,
  which showed even for a helper that only moves a tile to the pool: `draw_world` therefore paints runs and
  outline pixels in its own loop, the tile-to-pool step written out where needed, and the car and the bar, a few
  polygons each, queue op rows ``(y, xa, xb, colour, alpha)`` for one `apply_ops` loop per polygon;
- numba's array sort on the 2-4 crossings of a row cost more than the rest of the fill (insertion sort instead);
- a pool slot is `SLOT` = 16 pixels, a tile 10 or 11: a tile moved to the pool, and a fill run's end tile, are
  written as one branch-free select over the whole slot, padding included (no kernel reads past a tile's width),
  which numba vectorises, instead of a loop over the tile's pixels and then the run's.

Integer ranges: kernels work in int64; the caller checks with `poly_in_range` that SDL_gfx's int32 maths and its
subtracting qsort comparator cannot overflow (|coordinate| < 4096), so int64 and int32 agree, and falls back to
pygame otherwise. Pixels are 0x00RRGGBB: the caller checks the surface format is XRGB8888.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim_bridges.carracing.aaline import aaline
from sim_bridges.carracing.render_geometry import H, W

COORD_LIMIT = 4096
SLOT = 16  # pixels of a pool slot: a tile is 10 or 11, the rest padding no kernel reads


@njit(cache=True)
def poly_in_range(ix, iy):
    """Whether SDL_gfx's int32 maths on these vertices (K, V) cannot overflow (see module docstring)."""
    worst = 0
    for k in range(ix.shape[0]):
        for v in range(ix.shape[1]):
            worst = max(worst, abs(ix[k, v]), abs(iy[k, v]))
    return worst < COORD_LIMIT


@njit(cache=True)
def pack_road_colours(road_rgb, keep, n_grass, grass, out):
    """The 0xRRGGBB of the polygons `keep` (K,) indexes into `out` (K,): grass (index below n_grass) `grass`, road
    polygon i - n_grass row i - n_grass of road_rgb (P, 3) float colours, truncated to int as `int()` does. False
    where a truncated channel is outside 0..255 (or NaN)."""
    for k in range(out.shape[0]):
        i = keep[k]
        if i < n_grass:
            out[k] = grass
            continue
        packed = 0
        for ch in range(3):
            v = road_rgb[i - n_grass, ch]
            if not (v > -1.0 and v < 256.0):  # int(v) in 0..255; NaN fails both
                return False
            packed = (packed << 8) | int(v)
        out[k] = packed
    return True


# --- The tiled canvas `cv` = (hidden, colour, pool, used, tile_of, t_start, t_end): tile j of canvas row
# hidden + r is one colour colour[r, j] >= 0, or its pixels sit in pool[-colour[r, j] - 1, x - t_start[j]];
# used[0] counts the pool slots handed out this frame.


@njit(cache=True)
def _blend(d, c, alpha):
    """_putPixelAlpha's 32-bit blend, per channel d + (((c - d) * alpha) >> 8) (arithmetic shift)."""
    out = 0
    for sh in (16, 8, 0):
        dc = (d >> sh) & 255
        out |= ((dc + (((((c >> sh) & 255) - dc) * alpha) >> 8)) & 255) << sh
    return out


@njit(cache=True)
def apply_ops(ops, n_ops, cv):
    """Paint ops[:n_ops] in order: (y, xa, xb, c, 255) an opaque clipped run, (y, x, x, c, alpha) a blended pixel.

    False, painting nothing, if the pool might run out (an op takes at most two new slots): the caller falls back.
    An opaque run sets the tiles it covers whole in a plain store loop and paints pixels only in its (at most two)
    partly covered end tiles, as `draw_world` does in its own loop. Used for the car and the bar.
    """
    hidden, colour, pool, used, tile_of, t_start, t_end = cv
    if used[0] + 2 * n_ops > pool.shape[0]:
        return False
    for m in range(n_ops):
        y, xa, xb, c, alpha = ops[m, 0], ops[m, 1], ops[m, 2], ops[m, 3], ops[m, 4]
        r = y - hidden
        ja, jb = tile_of[xa], tile_of[xb]
        part_a, part_b = ja, -1  # partly painted tiles; a blended op is one pixel, so one tile
        if alpha == 255:
            full_a = ja if xa == t_start[ja] else ja + 1
            full_b = jb if xb == t_end[jb] else jb - 1
            for j in range(full_a, full_b + 1):
                colour[r, j] = c
            part_a = ja if full_a != ja else -1
            part_b = jb if full_b != jb and jb != part_a else -1
        for k in range(2):
            j = part_a if k == 0 else part_b
            if j < 0:
                continue
            a, b = max(xa, t_start[j]), min(xb, t_end[j])
            cj = colour[r, j]
            if cj >= 0:  # a uniform tile: unchanged, or its pixels go to a new pool slot
                if cj == (c if alpha == 255 else _blend(cj, c, alpha)):
                    continue
                slot = used[0]
                used[0] += 1
                for q in range(SLOT):  # the whole slot: one vector store
                    pool[slot, q] = cj
                colour[r, j] = -slot - 1
            slot = -colour[r, j] - 1
            for x in range(a, b + 1):
                q = x - t_start[j]
                pool[slot, q] = c if alpha == 255 else _blend(pool[slot, q], c, alpha)
    return True


@njit(cache=True)
def clip_run(y, xa, xb, hidden):
    """hlineColor(xa, xb, y)'s run: swapped if reversed, clipped to the surface; (False, ..) if nothing survives
    (also rows above `hidden`)."""
    if xa > xb:
        xa, xb = xb, xa
    if y < hidden or y >= H or xb < 0 or xa > W - 1:
        return False, xa, xb
    return True, max(xa, 0), min(xb, W - 1)


@njit(cache=True)
def _round_fixed(v):
    return (v >> 16) + ((v & 32768) >> 15)


@njit(cache=True)
def _fill_spans(vx, vy, hidden, ints, spans):
    """filledPolygonColorMT's runs on the surviving rows: spans[r] = (n, xa0, xb0, xa1, xb1) for row hidden + r,
    n = -1 where a row would need more than two runs. Returns the rows (lo, hi) it covers."""
    n = vx.shape[0]
    miny, maxy = vy.min(), vy.max()
    lo, hi = max(miny, hidden), min(maxy, H - 1)
    for y in range(lo, hi + 1):
        k = 0
        for i in range(n):
            i1 = n - 1 if i == 0 else i - 1
            y1, y2 = vy[i1], vy[i]
            if y1 < y2:
                x1, x2 = vx[i1], vx[i]
            elif y1 > y2:
                y1, y2 = vy[i], vy[i1]
                x1, x2 = vx[i], vx[i1]
            else:
                continue
            if (y >= y1 and y < y2) or (y == maxy and y > y1 and y <= y2):
                ints[k] = ((65536 * (y - y1)) // (y2 - y1)) * (x2 - x1) + 65536 * x1
                k += 1
        for i in range(1, k):  # insertion sort: k is 2 for convex polygons, numba's sort costs more
            v, m = ints[i], i - 1
            while m >= 0 and ints[m] > v:
                ints[m + 1] = ints[m]
                m -= 1
            ints[m + 1] = v
        r = y - hidden
        spans[r, 0] = k // 2 if k <= 4 else -1
        for i in range(0, min(k, 4) - 1, 2):
            xa = _round_fixed(ints[i] + 1)
            xb = _round_fixed(ints[i + 1] - 1)
            spans[r, 1 + i], spans[r, 2 + i] = min(xa, xb), max(xa, xb)  # hlineColor swaps reversed ends
    return lo, hi


@njit(cache=True)
def _paint_fill(spans, lo, hi, c, cv):
    """The fill's runs of rows lo..hi (`_fill_spans`) in colour c: whole tiles in a store loop, pixels only in the
    end tiles. One call per polygon (a per-pixel helper would cost reference counting at every call). False if the
    pool of pixel tiles would overflow."""
    hidden, colour, pool, used, tile_of, t_start, t_end = cv
    n_pool = pool.shape[0]
    for y in range(lo, hi + 1):
        r = y - hidden
        for m in range(spans[r, 0]):
            ok, xa, xb = clip_run(y, spans[r, 1 + 2 * m], spans[r, 2 + 2 * m], hidden)
            if not ok:
                continue
            ja, jb = tile_of[xa], tile_of[xb]
            full_a = ja if xa == t_start[ja] else ja + 1
            full_b = jb if xb == t_end[jb] else jb - 1
            for j in range(full_a, full_b + 1):
                colour[r, j] = c
            part_a = ja if full_a != ja else -1
            part_b = jb if full_b != jb and jb != part_a else -1
            for e in range(2):
                j = part_a if e == 0 else part_b
                if j < 0:
                    continue
                cj = colour[r, j]
                qa, qb = max(xa, t_start[j]) - t_start[j], min(xb, t_end[j]) - t_start[j]  # the run in the tile
                if cj >= 0:  # a uniform tile: unchanged, or its pixels go to a new pool slot, the run painted
                    if cj == c:
                        continue
                    if used[0] >= n_pool:
                        return False
                    slot = used[0]
                    used[0] += 1
                    for q in range(SLOT):  # the whole slot, padding included: one branch-free vector store
                        pool[slot, q] = c if qa <= q <= qb else cj
                    colour[r, j] = -slot - 1
                else:
                    slot = -cj - 1
                    for q in range(SLOT):
                        pool[slot, q] = c if qa <= q <= qb else pool[slot, q]
    return True


@njit(cache=True)
def draw_world(polys_x, polys_y, colours, bg, cv):
    """Reset every surviving row to `bg`, then gfxdraw.aapolygon + gfxdraw.filled_polygon each polygon, in order.

    polys_x/polys_y (K, V) int64 Sint16 vertices, colours (K,) 0xRRGGBB. Outline pixels the polygon's own fill
    paints over right after are not drawn: nothing reads them in between. The other outline pixels lie outside the
    fill, so the fill's runs are painted first and the outline's pixels after them, in their order, straight onto
    the canvas: the pixels `apply_ops` paints from queued ops, without the queue (the tile-to-pool step written out
    where it is needed; see the module docstring). Returns False (having drawn an unfinished frame) where a row
    would need more than two runs, which CarRacing's quads never do, or the pool of pixel tiles could overflow.
    """
    hidden, colour, pool, used, tile_of, t_start, t_end = cv
    colour[:] = bg
    used[0] = 0
    ints = np.empty(polys_x.shape[1], np.int64)
    spans = np.zeros((H - hidden, 5), np.int64)
    line = np.empty((2 * W + 2, 3), np.int64)
    n_pool = pool.shape[0]
    for k in range(polys_x.shape[0]):
        vx, vy, c = polys_x[k], polys_y[k], colours[k]
        lo, hi = _fill_spans(vx, vy, hidden, ints, spans)
        for y in range(lo, hi + 1):
            if spans[y - hidden, 0] == -1:
                return False
        if not _paint_fill(spans, lo, hi, c, cv):
            return False
        n = vx.shape[0]
        for i in range(n):  # the outline, edge by edge, each pixel as `aaline` writes it
            i2 = i + 1 if i + 1 < n else 0
            for m in range(aaline(vx[i], vy[i], vx[i2], vy[i2], line)):
                x, y, alpha = line[m, 0], line[m, 1], line[m, 2]
                if x < 0 or x > W - 1 or y < hidden or y >= H or alpha == 0:  # alpha 0: only the alpha byte
                    continue
                r = y - hidden
                if lo <= y <= hi:  # does the polygon's own fill paint this pixel next?
                    if spans[r, 0] >= 1 and spans[r, 1] <= x <= spans[r, 2]:
                        continue
                    if spans[r, 0] == 2 and spans[r, 3] <= x <= spans[r, 4]:
                        continue
                j = tile_of[x]
                cj = colour[r, j]
                if cj >= 0:
                    if cj == (c if alpha == 255 else _blend(cj, c, alpha)):
                        continue
                    if used[0] >= n_pool:
                        return False
                    slot = used[0]
                    used[0] += 1
                    for q in range(SLOT):  # the whole slot: one vector store
                        pool[slot, q] = cj
                    colour[r, j] = -slot - 1
                slot = -colour[r, j] - 1
                q = x - t_start[j]
                pool[slot, q] = c if alpha == 255 else _blend(pool[slot, q], c, alpha)
    return True
