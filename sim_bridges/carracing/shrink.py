"""pygame-ce 2.5.8's smoothscale area-averaging shrink (`filter_shrink_X` / `filter_shrink_Y`), exact, in numba.

Two backends, chosen at run time by `pygame.transform.get_smoothscale_backend()`: SSE/SSE2 (src_c/scale_mmx64_gcc.c
and its SSE2 intrinsics twin) works in 2.14 fixed point -- ``xspace = 0x4000*src/dst``, ``xrecip = 0x40000000 /
xspace``, pixels shifted left by 2, every product ``pmulhuw`` i.e. ``(a*b) >> 16``, results saturated by
``packuswb``; GENERIC (transform.c, ``*_ONLYC``) in 16.16 -- ``0x10000`` units, ``0x100000000 / xspace``, no shift,
``(Uint8)`` truncation. Verified against pygame on random images for both
(tests/sim_bridges/carracing/test_fast_render.py); the first C formula alone was off by one on 40 % of random pixels
under SSE2, hence both.

Each output pixel j takes the full source pixels after the previous output's split pixel, plus ``(p*xcounter)>>16``
of its own split pixel p; the rest of p, ``(p*xfrac)>>16``, starts the next output. `tile_geometry` replays the
counter loop once; the kernels then need no per-pixel counter. The X pass reads `sim_bridges.carracing.raster`'s tiled
canvas (one multiply per channel for a one-colour tile instead of ~10 additions); each row starts as a copy of the row
above, and only the tiles that changed, or follow one that did, are computed (the comparison is branch-free, so
numba vectorises it: faster than testing tile by tile, as `drive bench render --breakdown` shows against an older
commit).
"""

from __future__ import annotations

import threading

import numpy as np
from gymnasium.envs.box2d import car_racing as cr
from numba import njit

from sim_bridges.carracing.render_geometry import HIDDEN_ROWS, H, W


def tile_geometry(src: int, dst: int, unit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per output pixel j of a `src`->`dst` area shrink: its split pixel, xcounter there and xfrac.

    Replays the filter's counter loop (`xspace = unit*src/dst`; accumulate while xcounter > unit, else split).
    """
    xspace = unit * src // dst
    split, counter, frac = [], [], []
    xc = xspace
    for x in range(src):
        if xc > unit:
            xc -= unit
        else:
            split.append(x)
            counter.append(xc)
            frac.append(unit - xc)
            xc = xspace - (unit - xc)
    assert len(split) == dst, "the shrink must write exactly dst pixels"
    return np.array(split, np.int64), np.array(counter, np.int64), np.array(frac, np.int64)


@njit(cache=True)
def shrink_rows(cv, xc, xfrac, recip, shift, saturate, out, flip=True):
    """smoothscale's X pass over the tiled rows: out (n_rows, 96 * 3) RGB, written bottom-up (the flip) if `flip`.

    Output j depends only on tile j and the split pixel of tile j-1; where both are uniform and equal to the row
    above's, the value is the row above's (most of a frame: large one-colour areas). Those flags, same[j + 8] (same[7]
    for "tile -1" is 1), are read 8 at a time first as uint64 words: a block whose 8 flags and predecessor's are all 1
    is skipped at once, the rest tested tile by tile (most blocks of a row are unchanged). Width: 8k (96 here).
    """
    _, colour, pool, _, _, t_start, t_end = cv
    n_rows, n_out = colour.shape[0], out.shape[1] // 3
    up = -1 if flip else 1
    if n_out % 8:
        raise ValueError("shrink_rows: the output width must be a multiple of 8")
    same = np.zeros(n_out + 8, np.uint8)
    same[7] = 1
    words, every = same[8:].view(np.uint64), np.uint64(0x0101010101010101)  # words[w]: tiles 8w..8w+7
    for r in range(n_rows):
        o = n_rows - 1 - r if flip else r  # output row; o - up holds the canvas row above
        if r > 0:
            for i in range(3 * n_out):  # the row above's values; the tiles that differ are computed over them
                out[o, i] = out[o - up, i]
            for j in range(n_out):  # branch-free: vectorised
                same[j + 8] = (colour[r, j] >= 0) & (colour[r, j] == colour[r - 1, j])
        for w in range(n_out // 8):
            if r > 0 and words[w] == every and same[8 * w + 7]:
                continue
            for j in range(8 * w, 8 * w + 8):
                if r > 0 and same[j + 8] and same[j + 7]:
                    continue
                cj = colour[r, j]
                n = t_end[j] - t_start[j]  # full pixels; pixel n is the split one
                c0 = c1 = c2 = 0
                if j > 0:
                    d, f = colour[r, j - 1], xfrac[j - 1]
                    if d < 0:
                        d = pool[-d - 1, t_end[j - 1] - t_start[j - 1]]
                    c0 = ((((d >> 16) & 255) << shift) * f) >> 16
                    c1 = ((((d >> 8) & 255) << shift) * f) >> 16
                    c2 = (((d & 255) << shift) * f) >> 16
                if cj >= 0:
                    p0, p1, p2 = (cj >> 16) & 255, (cj >> 8) & 255, cj & 255
                    s0, s1, s2 = c0 + p0 * n, c1 + p1 * n, c2 + p2 * n
                else:
                    s0, s1, s2 = c0, c1, c2
                    slot = -cj - 1
                    for i in range(n):
                        d = pool[slot, i]
                        s0 += (d >> 16) & 255
                        s1 += (d >> 8) & 255
                        s2 += d & 255
                    d = pool[slot, n]
                    p0, p1, p2 = (d >> 16) & 255, (d >> 8) & 255, d & 255
                a = xc[j]
                v0 = ((s0 + (((p0 << shift) * a) >> 16)) * recip) >> 16
                v1 = ((s1 + (((p1 << shift) * a) >> 16)) * recip) >> 16
                v2 = ((s2 + (((p2 << shift) * a) >> 16)) * recip) >> 16
                if saturate:
                    out[o, 3 * j], out[o, 3 * j + 1], out[o, 3 * j + 2] = min(v0, 255), min(v1, 255), min(v2, 255)
                else:
                    out[o, 3 * j], out[o, 3 * j + 1], out[o, 3 * j + 2] = v0 & 255, v1 & 255, v2 & 255


@njit(cache=True)
def shrink_columns(src, r_start, r_end, yc, yfrac, recip, shift, saturate, out):
    """smoothscale's Y pass: src (n_src_rows, 96 * 3) -> out (96, 96 * 3), rows tiled like the X pass's columns.

    An output row's full source rows are summed in uint16 (at most 9 rows of 255 here: `Tiles` checks the bound), twice
    the lanes of int32 per vector instruction (24 -> 15 us per frame on this machine, `drive bench render --breakdown`'s
    Y shrink row), then finished in int32 like the filter."""
    n = src.shape[1]
    carry = np.zeros(n, np.int32)
    acc = np.empty(n, np.uint16)
    for j in range(out.shape[0]):
        acc[:] = 0
        for y in range(r_start[j], r_end[j]):
            for i in range(n):
                acc[i] += np.uint16(src[y, i])
        a, f, last = yc[j], yfrac[j], r_end[j]
        for i in range(n):
            t = np.int32(src[last, i]) << shift
            v = ((np.int32(acc[i]) + carry[i] + ((t * a) >> 16)) * recip) >> 16
            out[j, i] = min(v, 255) if saturate else v & 255
            carry[i] = (t * f) >> 16


@njit(cache=True)
def shrink_pixels(pixels, t_start, t_end, xc, xfrac, recip, shift, saturate, out):
    """smoothscale's X pass over plain pixel rows: pixels (n_rows, W) 0x..RRGGBB -> out (n_rows, 96 * 3) RGB."""
    for r in range(pixels.shape[0]):
        c0 = c1 = c2 = 0
        for j in range(out.shape[1] // 3):
            s0, s1, s2 = c0, c1, c2
            for x in range(t_start[j], t_end[j]):
                d = np.int64(pixels[r, x])
                s0 += (d >> 16) & 255
                s1 += (d >> 8) & 255
                s2 += d & 255
            d = np.int64(pixels[r, t_end[j]])
            p0, p1, p2 = ((d >> 16) & 255) << shift, ((d >> 8) & 255) << shift, (d & 255) << shift
            a = xc[j]
            v0 = ((s0 + ((p0 * a) >> 16)) * recip) >> 16
            v1 = ((s1 + ((p1 * a) >> 16)) * recip) >> 16
            v2 = ((s2 + ((p2 * a) >> 16)) * recip) >> 16
            if saturate:
                out[r, 3 * j], out[r, 3 * j + 1], out[r, 3 * j + 2] = min(v0, 255), min(v1, 255), min(v2, 255)
            else:
                out[r, 3 * j], out[r, 3 * j + 1], out[r, 3 * j + 2] = v0 & 255, v1 & 255, v2 & 255
            f = xfrac[j]
            c0, c1, c2 = (p0 * f) >> 16, (p1 * f) >> 16, (p2 * f) >> 16


_SCRATCH = threading.local()


def _scratch(n_tiles: int) -> tuple[np.ndarray, ...]:
    """This thread's canvases and frame buffers, shared by every `Tiles` of the thread: a frame is drawn from scratch
    into them within one `render_state_pixels` call, so K envs stepped in turn (K cars per process) write one set
    of these ~0.5 MB every frame instead of K sets, which left the controller's weights and activations less of the
    cache between its calls. Per thread, so envs rendered on two threads never share one."""
    buffers = getattr(_SCRATCH, "buffers", None)
    if buffers is None or buffers[0].shape[1] != n_tiles:
        n_vis = H - HIDDEN_ROWS
        buffers = _SCRATCH.buffers = (
            np.zeros((n_vis, n_tiles), np.int32),  # a tile's colour, or -1 - its pool slot
            np.zeros((n_vis * n_tiles, 16), np.int32),  # the pixel pool: every tile pooled, at worst
            np.zeros(1, np.int64),  # pool slots handed out
            np.zeros((H, cr.STATE_W * 3), np.uint8),  # X-shrunk: flipped world rows, then the bar
            np.zeros((cr.STATE_H, cr.STATE_W * 3), np.uint8),  # the frame
            np.zeros((HIDDEN_ROWS, n_tiles), np.int32),  # the bar's canvas (drawn whenever the bar changes)
            np.zeros((HIDDEN_ROWS * n_tiles, 16), np.int32),
            np.zeros(1, np.int64),
        )
    return buffers


class Tiles:
    """Buffers and smoothscale geometry of `sim_bridges.carracing.fast_render`'s exact path (one smoothscale backend's
    maths): the tiled world canvas of `sim_bridges.carracing.raster`, the bar's (`sim_bridges.carracing.indicators`),
    the X-shrunk frame. The canvases and frame buffers are the thread's (`_scratch`); the X-shrunk bar rows are this
    env's own, kept between frames while the bar does not change."""

    def __init__(self, backend: str) -> None:
        sse = backend != "GENERIC"
        unit = 0x4000 if sse else 0x10000
        self.shift, self.saturate = (2, True) if sse else (0, False)
        split, self.xc, self.xfrac = tile_geometry(W, cr.STATE_W, unit)
        self.t_start = np.concatenate([[0], split + 1])  # (97,) the last tile: pixels after the final split
        self.t_end = np.concatenate([split, [W - 1]])
        self.tile_of = np.repeat(np.arange(len(self.t_start)), self.t_end - self.t_start + 1)  # (W,)
        rows, self.yc, self.yfrac = tile_geometry(H, cr.STATE_H, unit)
        self.r_start, self.r_end = np.concatenate([[0], rows[:-1] + 1]), rows
        assert 255 * int((self.r_end - self.r_start).max()) < 1 << 16, "shrink_columns sums rows in uint16"
        top = 0x40000000 if sse else 1 << 32
        self.xrecip, self.yrecip = top // (unit * W // cr.STATE_W), top // (unit * H // cr.STATE_H)
        self.bind()
        self.bar_rows = np.zeros((HIDDEN_ROWS, cr.STATE_W * 3), np.uint8)  # this env's X-shrunk bar
        self.bar_key: tuple | None = None  # (score string, rectangles) behind bar_rows

    def bind(self) -> None:
        """Draw into the calling thread's canvases and frame buffers (`fast_render` binds before every frame, so an
        env handed to another thread never draws into buffers a thread it left is using)."""
        scratch = _scratch(len(self.t_start))
        self.colour, self.pool, self.used, self.frame, self.out = scratch[:5]  # the world's tiled canvas, frame
        self.bar_colour, self.bar_pool, self.bar_used = scratch[5:]  # the bar's tiled canvas

    def canvas(self) -> tuple:
        """The `sim_bridges.carracing.raster` canvas tuple."""
        return HIDDEN_ROWS, self.colour, self.pool, self.used, self.tile_of, self.t_start, self.t_end

    def bar_canvas(self) -> tuple:
        """The same for the bar rows, H - HIDDEN_ROWS.. of the flipped surface."""
        return H - HIDDEN_ROWS, self.bar_colour, self.bar_pool, self.bar_used, self.tile_of, self.t_start, self.t_end
