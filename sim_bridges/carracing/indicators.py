"""CarRacing's indicator bar and score (the bottom HIDDEN_ROWS rows of the frame), X-shrunk without a pygame surface.

Stock `_render_indicators` paints those rows black, then up to seven `pygame.draw.polygon` rectangles (speed, four
wheel speeds, steering, yaw rate), and `_render` blits the score text over them. Here the same rectangles, from the
same float expressions truncated to int as pygame-ce does (checked: its fill depends on the truncated vertices
only), are filled by `sim_bridges.carracing.raster_car`'s exact copy of pygame's polygon fill, and the score text's
pixels (blitted once per string onto black: the text surface is opaque, 8-bit, no colour key, so the blit is a copy)
are pasted, all on a tiled canvas that `sim_bridges.carracing.shrink.shrink_rows` X-shrinks like the world. Whenever the
integer vertices and the score string equal the previous frame's, the shrunk rows are reused as they are.
The score's own columns are shrunk once per string, apart from the rectangles, where they do not meet
(`shrink_bar`).

What a step spends here: the "bar and score" row of `drive bench render --breakdown` (docs/scale.md has a run).
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pygame
from numba import njit

from sim_bridges.carracing import shrink
from sim_bridges.carracing.raster import COORD_LIMIT, SLOT, H, W, apply_ops
from sim_bridges.carracing.raster_car import _poly_runs

_MAX_TEXT_CACHE = 4096
_NO_TEXT, _NO_RECTS = np.zeros((0, 0), np.uint8), np.zeros((0, 9), np.int64)
_WHITE, _BLUE, _VIOLET, _GREEN, _RED = 0xFFFFFF, 0x0000FF, 0x3300FF, 0x00FF00, 0xFF0000


# The seven rectangles of `_render_indicators`, in its order: (place, gain, colour, vertical) of speed, the four wheel
# speeds, the steering angle and the yaw rate
_PLACES = np.array([5, 7, 8, 9, 10, 20, 30], np.float64)
_GAINS = np.array([0.02, 0.01, 0.01, 0.01, 0.01, -10.0, -0.8])
_COLOURS = np.array([_WHITE, _BLUE, _BLUE, _VIOLET, _VIOLET, _GREEN, _RED], np.int64)
_VERTICAL = np.array([True, True, True, True, True, False, False])


@njit(cache=True)
def indicator_rects(vx, vy, w0, w1, w2, w3, steer, yaw, out):
    """`_render_indicators(W, H)`'s coloured rectangles as rows (x0, y0, .., x3, y3, 0xRRGGBB) of out (7, 9), from the
    hull velocity (vx, vy), the wheel speeds, the front wheel's joint angle and the hull's angular velocity, with
    gymnasium 1.4.0's float expressions (IEEE float64, as Python computes them) and vertices truncated to int as
    pygame-ce's draw.polygon does. Returns how many rows it wrote, or -1 where a vertex is out of the range the fill
    kernel is checked for (or NaN)."""
    s, h = W / 40.0, H / 40.0
    values = (math.sqrt(vx * vx + vy * vy), w0, w1, w2, w3, steer, yaw)  # np.sqrt(np.square(.) + ..): same bits
    pts = np.empty(8)
    n = 0
    for i in range(7):
        value = values[i]
        if not abs(value) > 1e-4:
            continue
        place, val = _PLACES[i], _GAINS[i] * value
        if _VERTICAL[i]:
            top = H - (h + h * val)
            pts[0], pts[1], pts[2], pts[3] = place * s, top, (place + 1) * s, top
            pts[4], pts[5], pts[6], pts[7] = (place + 1) * s, H - h, (place + 0) * s, H - h
        else:
            pts[0], pts[1], pts[2], pts[3] = (place + 0) * s, H - 4 * h, (place + val) * s, H - 4 * h
            pts[4], pts[5], pts[6], pts[7] = (place + val) * s, H - 2 * h, (place + 0) * s, H - 2 * h
        for v in range(8):
            if not (pts[v] < COORD_LIMIT and pts[v] > -COORD_LIMIT):  # NaN fails both
                return -1
            out[n, v] = np.int64(pts[v])  # truncation toward zero, as int()
        out[n, 8] = _COLOURS[i]
        n += 1
    return n


_RECTS = threading.local()  # per thread: indicator_polygons's (7, 9) output buffer


def indicator_polygons(car) -> np.ndarray | None:
    """`indicator_rects` of a car (a (K, 9) int64 view of a per-thread buffer, valid until the next call), or None
    where a vertex is out of range."""
    vx, vy = car.hull.linearVelocity
    wheels = car.wheels
    out = _RECTS.__dict__.get("out")
    if out is None:
        out = _RECTS.out = np.empty((7, 9), np.int64)
    n = indicator_rects(
        vx,
        vy,
        wheels[0].omega,
        wheels[1].omega,
        wheels[2].omega,
        wheels[3].omega,
        wheels[0].joint.angle,
        car.hull.angularVelocity,
        out,
    )
    return None if n < 0 else out[:n]


def text_block(text: pygame.Surface) -> np.ndarray:
    """The palette indices (h, w) uint8 of an 8-bit text surface (`Font.render` with a background colour)."""
    if text.get_bitsize() != 8:
        raise ValueError(f"text_block: an 8-bit text surface expected, got {text.get_bitsize()} bits")
    width, height = text.get_size()
    return np.frombuffer(pygame.image.tobytes(text, "P"), np.uint8).reshape(height, width)


def text_palette(text: pygame.Surface, like: pygame.Surface) -> np.ndarray:
    """The pixel (256,) int64 0xRRGGBB that blitting the 8-bit `text` onto a surface in `like`'s format writes for
    each palette index: SDL maps each palette colour to the destination format once (an opaque 8-bit blit)."""
    return np.array([like.map_rgb(colour) & 0xFFFFFF for colour in text.get_palette()], np.int64)


@njit(cache=True)
def draw_bar(rects, block, palette, bx, by, cv):
    """Black rows, then rects (K, 9) filled like pygame.draw.polygon in order, then the text `block` (palette
    indices) pasted at (bx, by) in `palette`'s colours: the bar rows of canvas `cv` (whose `hidden` is H - its row
    count). Returns the leftmost x a rectangle painted (W if none), -1 where the pool could overflow."""
    hidden, colour, pool, used, tile_of, t_start, t_end = cv
    colour[:] = 0
    used[0] = 0
    ops = np.empty((2 * (H - hidden) + 8, 5), np.int64)
    ints = np.empty(4, np.int64)
    vx, vy = np.empty(4, np.int64), np.empty(4, np.int64)
    left = W
    for k in range(rects.shape[0]):
        for v in range(4):
            vx[v], vy[v] = rects[k, 2 * v], rects[k, 2 * v + 1]
        n_ops = _poly_runs(vx, vy, rects[k, 8], hidden, ops, 0, ints)
        if not apply_ops(ops, n_ops, cv):
            return -1
        for m in range(n_ops):
            left = min(left, ops[m, 1])
    xa, xb = max(bx, 0), min(bx + block.shape[1] - 1, W - 1)
    for row in range(block.shape[0]):
        y = by + row
        if y < hidden or y >= H or xa > xb:
            continue
        r = y - hidden
        for j in range(tile_of[xa], tile_of[xb] + 1):
            cj = colour[r, j]
            if cj >= 0:  # to the pool, then overwrite the pixels the block covers
                if used[0] >= pool.shape[0]:
                    return -1
                slot = used[0]
                used[0] += 1
                for q in range(SLOT):  # the whole slot: one vector store
                    pool[slot, q] = cj
                colour[r, j] = -slot - 1
            slot = -colour[r, j] - 1
            for x in range(max(xa, t_start[j]), min(xb, t_end[j]) + 1):
                pool[slot, x - t_start[j]] = palette[block[row, x - bx]]
    return left


class Fonts:
    """The score font, loaded once instead of every frame; rendered score strings and their palette indices by
    value, shared by every env of the process; the text palette in the canvas's format.

    Dropped whenever pygame.font was shut down (pygame.quit(), or found uninitialised at the next frame).
    """

    font: pygame.font.Font | None = None
    texts: dict[str, pygame.Surface] = {}
    blocks: dict[str, np.ndarray] = {}
    palettes: dict[tuple, np.ndarray] = {}
    bands: dict[tuple, np.ndarray | None] = {}  # `_text_band`'s X-shrunk text columns

    @classmethod
    def reset(cls) -> None:
        cls.font = None
        cls.texts = {}
        cls.blocks = {}
        cls.palettes = {}
        cls.bands = {}

    @classmethod
    def block(cls, s: str, like: pygame.Surface) -> tuple[np.ndarray, np.ndarray]:
        """The rendered `s` as palette indices (h, w), and what each index writes on a surface in `like`'s format.
        Every score text has the same palette (white on black, the font's grey ramp: tested), so one is kept per
        pixel format."""
        block = cls.blocks.get(s)
        if block is None:
            if len(cls.blocks) >= _MAX_TEXT_CACHE:
                cls.blocks.clear()
            block = cls.blocks[s] = text_block(cls.text(s))
        fmt = (like.get_bitsize(), like.get_masks())
        palette = cls.palettes.get(fmt)
        if palette is None:
            palette = cls.palettes[fmt] = text_palette(cls.text(s), like)
        return block, palette

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


def shrink_bar(tiles, env, score: str, like: pygame.Surface) -> bool:
    """Draw and X-shrink the bar rows into `tiles.bar_rows` (a `sim_bridges.carracing.shrink.Tiles`), or keep them where
    the rectangles and score are unchanged; False (frame rows unset) where the kernels decline.

    Output pixel j of a row reads tiles j - 1 and j only, so where every rectangle lies right of the tile after the
    score text's last (black in every row), the output up to that tile is the text's alone and the rest the
    rectangles' alone: the text's part is shrunk once per score string and pixel format (`Fonts.bands`, shared by
    every env of the process) and only the rectangles are drawn and shrunk each frame. Otherwise both are drawn
    together."""
    rects = indicator_polygons(env.car)
    if rects is None:
        return False
    key = (score, like.get_bitsize(), like.get_masks(), rects.tobytes())
    if key == tiles.bar_key:
        return True
    tiles.bar_key = None
    text_rect = Fonts.text(score).get_rect()
    text_rect.center = (60, H - H * 2.5 / 40.0)  # as stock, Rect's own float handling included
    block, palette = Fonts.block(score, like)
    bar, canvas = tiles.bar_rows, tiles.bar_canvas()
    band = _text_band(tiles, key[:3], block, palette, text_rect.x, text_rect.y)
    if band is not None:  # the rectangles alone, then the text's columns
        left = draw_bar(rects, _NO_TEXT, palette, 0, 0, canvas)
        if left >= 0 and tiles.tile_of[min(left, W - 1)] > band.shape[1] // 3 - 1:
            shrink.shrink_rows(canvas, tiles.xc, tiles.xfrac, tiles.xrecip, tiles.shift, tiles.saturate, bar, False)
            bar[:, : band.shape[1]] = band
            tiles.bar_key = key
            return True
    if draw_bar(rects, block, palette, text_rect.x, text_rect.y, canvas) < 0:
        return False
    shrink.shrink_rows(canvas, tiles.xc, tiles.xfrac, tiles.xrecip, tiles.shift, tiles.saturate, bar, False)
    tiles.bar_key = key
    return True


def _text_band(tiles, key: tuple, block: np.ndarray, palette: np.ndarray, bx: int, by: int) -> np.ndarray | None:
    """The X-shrunk bar rows (HIDDEN_ROWS, 3 * (b + 2)) of the score text alone, b its last tile: outputs 0..b + 1,
    which read no tile past b + 1 (black unless a rectangle reaches it); None where the text is not on the bar."""
    key = (*key, tiles.shift, tiles.saturate)  # the smoothscale backend's maths
    bands = Fonts.bands
    band = bands.get(key)
    if band is None and key not in bands:
        if len(bands) >= _MAX_TEXT_CACHE:  # ~3.6 kB each
            bands.clear()
        xb = bx + block.shape[1] - 1
        if (
            block.size == 0
            or bx < 0
            or xb > W - 1
            or draw_bar(_NO_RECTS, block, palette, bx, by, tiles.bar_canvas()) < 0
        ):
            bands[key] = None
            return None
        rows = np.empty_like(tiles.bar_rows)
        shrink.shrink_rows(
            tiles.bar_canvas(), tiles.xc, tiles.xfrac, tiles.xrecip, tiles.shift, tiles.saturate, rows, False
        )
        band = bands[key] = rows[:, : 3 * (min(tiles.tile_of[xb] + 2, len(tiles.t_start) - 1))].copy()
    return band
