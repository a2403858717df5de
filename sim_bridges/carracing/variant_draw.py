"""The layers of the CarRacingExtension variants (`sim_bridges.carracing.variants`), drawn by our renderer
(`sim_bridges.carracing.fast_render`) at the step of stock's `_render` where each belongs, in both of its paths: on the
tiled canvas of the exact kernels (`sim_bridges.carracing.raster`) and on a pygame surface (its fallback).

- texture (noise, video) -- instead of the background field and the grass patches: the image is mapped onto the
  playfield square (+-PLAYFIELD) in world coordinates, bilinear (cv2.warpAffine with the view's inverse, image row
  0 at +PLAYFIELD: north up), over the surviving rows of the 1000 x 800 surface, then the road and kerbs are drawn
  over it by stock's SDL_gfx calls (`fast_render._draw_world`), so their anti-aliased edges blend into it. Only on
  the pygame path: the tiled canvas keeps a row as runs of one colour, which a texture is not. Measured on the
  2-core dev machine (busy; best of 3 x 240 steps on seed 1000 after the zoom-in): a step of the clean env took
  ~1.0-1.3 ms, of color, color3, bar, blob the same, of noise ~3.0 ms, of video (640 x 360 frames) ~3.6 ms. The
  warp runs on 4-channel texels (XRGB8888 bytes, written straight into the surface), ~2x faster than on RGB.
- blob -- right after the car (theirs draws it between the hull's third and fourth polygons; the two never meet,
  the blob lying 19 world units to the side): `pygame.draw.polygon`'s fill of its four vertices, computed as the
  car's are (pybox2d's float32 transform, Vector2.rotate_rad, truncation to int): `raster_car.draw_car` on the
  tiles, pygame.draw.polygon on a surface -- the same pixels.
- bars -- after the world and the car, as theirs with the indicators: black filled rectangles (0, 0)-(3s, H - 5h)
  and (W - 3s, 0)-(W, H - 5h) of the flipped surface, s = W/40, h = H/40: integer corners, so the closed boxes
  x in [0, 75] and [925, 999], rows [0, 700] after the flip, i.e. every row that reaches the frame; opaque runs
  (`raster.apply_ops`) on the tiles, `Surface.fill` on a surface.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import cv2
import numpy as np
import pygame
from gymnasium.envs.box2d import car_racing as cr

from sim_bridges.carracing import raster, raster_car
from sim_bridges.carracing.render_geometry import HIDDEN_ROWS, H, W, to_screen

BLOB_RGB = (204, 0, 0)  # (0.8, 0, 0) as Car.draw converts colours: int(c * 255)
BLOB_SIDE = 8.0  # world units
BLOB_OFFSET = (20.0, 10.0)  # world units, right and forward of the hull's fourth polygon's first vertex
BAR_WIDTH = int(3 * W / 40.0)  # 75: the bars' last column (left), W - 75 their first (right)
BAR_LAST_ROW = int(H - 5 * H / 40.0)  # 700 after the flip: the indicator bar's first row
XRGB_MASKS = (0xFF0000, 0xFF00, 0xFF)


class Layers(NamedTuple):
    """What a variant adds to one frame: a grass texture (h, w, 4) uint8 (`as_texture`) with its `texture_map`, the
    blob's float screen vertices (4, 2), the bars."""

    texture: np.ndarray | None
    texture_map: np.ndarray | None  # (2, 3): canvas pixel (x, y - HIDDEN_ROWS) -> texture pixel
    blob: np.ndarray | None
    bars: bool


NO_LAYERS = Layers(None, None, None, False)


def texture_map(shape: tuple[int, ...], zoom: float, trans, angle: float) -> np.ndarray:
    """The affine map (2, 3) from a surviving canvas pixel (x, y - HIDDEN_ROWS) of the unflipped surface, sampled at
    its centre, to a texture of `shape` (h, w, ...) spread over +-PLAYFIELD, pixel centres at integers (cv2's)."""
    c, s = math.cos(angle), math.sin(angle)
    kx, ky = shape[1] / (2 * cr.PLAYFIELD), shape[0] / (2 * cr.PLAYFIELD)
    # world = R(-angle) (screen - trans) / zoom; u = kx (x_w + P) - 0.5; v = ky (P - y_w) - 0.5
    x0, y0 = 0.5 - trans[0], HIDDEN_ROWS + 0.5 - trans[1]
    return np.array(
        [
            [kx * c / zoom, kx * s / zoom, kx * (c * x0 + s * y0) / zoom + kx * cr.PLAYFIELD - 0.5],
            [ky * s / zoom, -ky * c / zoom, -ky * (-s * x0 + c * y0) / zoom + ky * cr.PLAYFIELD - 0.5],
        ]
    )


def texel_window(shape: tuple[int, ...], tmap: np.ndarray) -> tuple[int, int, int, int]:
    """The texels (v0, v1, u0, u1) of a texture of `shape` that the map `tmap` (`texture_map`) can sample, bilinear
    neighbours included: a noise texture need only be drawn there."""
    n_vis = H - HIDDEN_ROWS
    corners = tmap @ np.array([[0, W, 0, W], [0, 0, n_vis, n_vis], [1, 1, 1, 1]], np.float64)  # (2, 4): u, v
    lo, hi = np.floor(corners.min(axis=1)) - 1, np.ceil(corners.max(axis=1)) + 2
    u0, u1 = (int(np.clip(x, 0, shape[1])) for x in (lo[0], hi[0]))
    v0, v1 = (int(np.clip(x, 0, shape[0])) for x in (lo[1], hi[1]))
    return v0, max(v0, v1), u0, max(u0, u1)


def paint_texture(surf: pygame.Surface, layers: Layers) -> None:
    """The texture over the surviving rows of `surf` (black outside the playfield, as stock's fresh surface): warped
    straight into the pixels of an XRGB8888 surface (the texture holds their bytes), else converted and blitted."""
    assert layers.texture is not None and layers.texture_map is not None
    size, flags = (W, H - HIDDEN_ROWS), cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    if surf.get_bitsize() == 32 and surf.get_masks()[:3] == XRGB_MASKS and surf.get_pitch() == 4 * W:
        pixels = pygame.surfarray.pixels2d(surf).T  # (H, W) uint32 view, locks the surface until deleted
        rows = pixels.view(np.uint8).reshape(H, W, 4)[HIDDEN_ROWS:]
        cv2.warpAffine(
            layers.texture,
            layers.texture_map,
            size,
            dst=rows,
            flags=flags,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=(0, 0, 0, 0),
        )
        del pixels, rows
        return
    bgrx = cv2.warpAffine(
        layers.texture, layers.texture_map, size, flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0, 0)
    )
    rgb = cv2.cvtColor(bgrx, cv2.COLOR_BGRA2RGB)
    surf.blit(pygame.image.frombuffer(rgb, size, "RGB"), (0, HIDDEN_ROWS))


def as_texture(bgr: np.ndarray) -> np.ndarray:
    """An (h, w, 3) uint8 BGR image (OpenCV's order) as a texture: (h, w, 4) uint8 B, G, R, 0, the bytes of XRGB8888
    pixels (a 4-channel bilinear warp also runs ~2x faster than a 3-channel one here)."""
    texture = np.zeros((*bgr.shape[:2], 4), np.uint8)
    texture[..., :3] = bgr
    return texture


def blob_world(car) -> list[tuple[float, float]]:
    """The blob's corners in world coordinates: its local square through the hull's transform (float32, b2Mul)."""
    hull = car.hull
    vx, vy = hull.fixtures[3].shape.vertices[0]
    x0, y0 = vx + BLOB_OFFSET[0], vy + BLOB_OFFSET[1]
    local = [(x0, y0 + BLOB_SIDE), (x0 + BLOB_SIDE, y0 + BLOB_SIDE), (x0 + BLOB_SIDE, y0), (x0, y0)]  # theirs
    transform = hull.transform
    return [tuple(transform * v) for v in local]


def blob_screen(car, zoom: float, trans, angle: float) -> np.ndarray:
    """The blob's float screen vertices (4, 2) on the unflipped surface, with stock's view maths."""
    sx, sy = to_screen(np.array([blob_world(car)], np.float64), zoom, trans, angle)  # (1, 4) each
    return np.stack([sx[0], sy[0]], axis=-1)


_BAR_OPS = np.array(
    [(y, xa, xb, 0, 255) for y in range(HIDDEN_ROWS, H) for xa, xb in ((0, BAR_WIDTH), (W - BAR_WIDTH, W - 1))],
    np.int64,
)  # (2 * (H - HIDDEN_ROWS), 5): raster.apply_ops's opaque black runs of both bars on every surviving row
_BLOB_COLOUR = np.array([(BLOB_RGB[0] << 16) | (BLOB_RGB[1] << 8) | BLOB_RGB[2]], np.int64)
_BLOB_COUNTS = np.array([4], np.int64)


def on_tiles(layers: Layers, cv: tuple) -> bool:
    """Blob and bars onto `sim_bridges.carracing.raster`'s tiled canvas `cv`; False (the caller falls back to pygame)
    where the blob's vertices leave the range where pygame's int conversion is plain truncation, or the pool could
    overflow."""
    if layers.blob is not None:
        x, y = layers.blob[:, 0], layers.blob[:, 1]
        if min(x.min(), y.min()) < 0 or max(x.max(), y.max()) >= 1 << 30:
            return False
        px, py = np.zeros((1, 8), np.int64), np.zeros((1, 8), np.int64)
        px[0, :4], py[0, :4] = x.astype(np.int64), y.astype(np.int64)
        px[0, 4:], py[0, 4:] = px[0, 3], py[0, 3]
        if not raster_car.draw_car(px, py, _BLOB_COUNTS, _BLOB_COLOUR, cv):
            return False
    return not layers.bars or raster.apply_ops(_BAR_OPS, len(_BAR_OPS), cv)


def on_surface(layers: Layers, surf: pygame.Surface) -> None:
    """Blob and bars onto the unflipped 1000 x 800 `surf` (the bars' rows 0..700 after the flip are 99..799 here)."""
    if layers.blob is not None:
        pygame.draw.polygon(surf, BLOB_RGB, [tuple(v) for v in layers.blob.tolist()])
    if layers.bars:
        top = H - 1 - BAR_LAST_ROW
        surf.fill((0, 0, 0), (0, top, BAR_WIDTH + 1, H - top))
        surf.fill((0, 0, 0), (W - BAR_WIDTH, top, BAR_WIDTH, H - top))
