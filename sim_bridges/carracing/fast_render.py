"""Fast CarRacing-v3 `state_pixels` renderer, bit-for-bit identical to gymnasium 1.4.0's `_render`.

Stock rendering draws a 1000x800 surface through ~1000 Python-level pygame/SDL_gfx calls, flips it and
smoothscales it to 96x96. Here the frame comes from exact integer re-implementations, in numba, of each step:
SDL_gfx's aapolygon + filled_polygon for background, grass and road (`sim_bridges.carracing.raster`), pygame's polygon
fill for the car (`sim_bridges.carracing.raster_car`) and smoothscale's two area-averaging passes
(`sim_bridges.carracing.shrink`), computed only over what reaches the output: rows 0..99 before the flip end up under
the opaque indicator bar, and of each surviving row only its 96 X-shrunk values matter, so rows are kept as runs of one
colour per output pixel ("tiles") plus the few pixels that differ (see `sim_bridges.carracing.raster`). The float maths
that gives the integer vertices -- Vector2.rotate_rad, pybox2d's float32 b2Mul for the car -- and stock's culling run in
numba (`sim_bridges.carracing.view`), tested bit for bit against the numpy reference in
`sim_bridges.carracing.render_geometry`. The indicator bar and score are drawn on a tiled canvas of their own and
X-shrunk by the same kernel, and kept as they are while their integer inputs do not change
(`sim_bridges.carracing.indicators`). Road colours, which contacts change in place, are read every frame: from the
bridge's `road_rgb` array in one kernel where the env binds one (`sim_bridges.carracing.bridge`), else from `road_poly`
entry by entry. A CarRacingExtension variant the env carries (`episode_variant`, `sim_bridges.carracing.variants`) adds
its layers where `sim_bridges.carracing.variant_draw` says, in both paths; its grass texture (noise, video) is drawn on
the pygame path only.

Departures from drawing everything, each proven not to change a pixel:
- polygons stock culls (its MAX_SHAPE_DIM test, reproduced) or whose pixels all miss the surviving rows;
- the background polygon when SDL_gfx's scanline maths provably covers every surviving row
  (`_fill_covers_visible_rows`): a plain fill instead;
- outline pixels a polygon's own fill paints over right after; the full-size flip (only 96-wide rows flip);
- the font load (cached) and re-rendering an unchanged score string.
Where an integer guarantee of the kernels does not hold (a coordinate past +-4096 px, where SDL_gfx's int32 maths
could overflow; the smoothscale backend neither SSE/SSE2 nor GENERIC; a surface format other than XRGB8888), the
frame is drawn by the same pygame/SDL_gfx calls as stock instead (`_draw_world`), as before this path existed.

Where a frame's time goes, stage by stage, against stock's frame and cv2's frame coding: `drive bench render
--breakdown` (docs/scale.md has a run). Numba compiles once per source version (``cache=True``); `drive bench
render` prints what the first frame of a process costs (a cache load after the first run).
"""

from __future__ import annotations

import weakref

import numpy as np
import pygame
from gymnasium.envs.box2d import car_racing as cr
from pygame import gfxdraw

from sim_bridges.carracing import indicators, raster, raster_car, shrink, variant_draw, view
from sim_bridges.carracing.indicators import Fonts as _Fonts
from sim_bridges.carracing.render_geometry import FIELD as _FIELD
from sim_bridges.carracing.render_geometry import GRASS as _GRASS
from sim_bridges.carracing.render_geometry import HIDDEN_ROWS, STATE_SIZE, H, W
from sim_bridges.carracing.shrink import Tiles as _Tiles
from sim_bridges.carracing.view import fill_covers as _fill_covers_visible_rows

__all__ = ["render_state_pixels"]

_XRGB8888 = (0xFF0000, 0xFF00, 0xFF, 0)


class _EnvCache:
    """Per-env reusable surfaces and per-episode geometry (grass then road polygons, stock draw order)."""

    def __init__(self) -> None:
        self.road_poly: list | None = None
        self.polys = _GRASS
        self.display: pygame.Surface | None = None
        self.canvas: pygame.Surface | None = None
        self.mapped_cache: dict[tuple, int] = {}

    def geometry(self, env) -> np.ndarray:
        road = env.road_poly
        if road is not self.road_poly or len(road) != len(self.polys) - len(_GRASS):
            verts = np.array([[(p[0], p[1]) for p in poly] for poly, _ in road], dtype=np.float64).reshape(-1, 4, 2)
            self.polys = np.concatenate([_GRASS, verts])  # (400 + P, 4, 2)
            self.keep = np.zeros(len(self.polys), np.int64)
            self.ix, self.iy = np.zeros((len(self.polys), 4), np.int64), np.zeros((len(self.polys), 4), np.int64)
            self.road_poly = road
        return self.polys

    def mapped_rgb(self, color) -> int:
        key = tuple(np.asarray(color).tolist())
        if key not in self.mapped_cache:
            self.mapped_cache[key] = self.mapped(color) & 0xFFFFFF
        return self.mapped_cache[key]

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
        self.mapped_cache = {}
        backend = pygame.transform.get_smoothscale_backend()
        exact = self.canvas.get_bitsize() == 32 and self.canvas.get_masks() == _XRGB8888
        self.tiles = _Tiles(backend) if exact and backend in ("SSE2", "SSE", "GENERIC") else None

    def mapped(self, color) -> int:
        """The pixel value SDL_gfx's filled polygon writes for `color` on the canvas format."""
        gfxdraw.filled_polygon(self.probe, [(0, 0), (3, 0), (3, 3), (0, 3)], color)
        return self.probe.get_at_mapped((1, 1))


_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _visible(env, cache: _EnvCache, zoom: float, trans, rot) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices (K,) into `cache.geometry` of the polygons stock draws that can reach the output, in draw order,
    and their Sint16 vertices (K, 4) x and y (views of reused buffers)."""
    polys = cache.geometry(env)
    k = view.visible_polygons(
        polys, *rot, zoom, trans[0], trans[1], cr.MAX_SHAPE_DIM, True, cache.keep, cache.ix, cache.iy
    )
    return cache.keep[:k], cache.ix[:k], cache.iy[:k]


def _field(zoom: float, trans, rot) -> tuple[np.ndarray, np.ndarray]:
    """The background polygon's Sint16 vertices (1, 4) x and y."""
    fx, fy, keep = np.zeros((1, 4), np.int64), np.zeros((1, 4), np.int64), np.zeros(1, np.int64)
    view.visible_polygons(_FIELD, *rot, zoom, trans[0], trans[1], cr.MAX_SHAPE_DIM, False, keep, fx, fy)
    return fx, fy


def _draw_world(
    surf: pygame.Surface,
    env,
    cache: _EnvCache,
    zoom: float,
    trans,
    rot,
    layers: variant_draw.Layers = variant_draw.NO_LAYERS,
) -> None:
    """Background, grass and road, as `CarRacing._render_road` draws them, minus provably invisible work; a variant's
    texture instead of background and grass (`sim_bridges.carracing.variant_draw`)."""
    fx, fy = _field(zoom, trans, rot)
    if layers.texture is not None:
        variant_draw.paint_texture(surf, layers)
    elif _fill_covers_visible_rows(fx[0], fy[0]):
        surf.fill(cache.mapped(env.bg_color), (0, HIDDEN_ROWS, W, H - HIDDEN_ROWS))
    else:
        surf.fill(0)  # a fresh pygame.Surface is zeroed
        field = list(zip(fx[0].tolist(), fy[0].tolist(), strict=True))
        gfxdraw.aapolygon(surf, field, env.bg_color)
        gfxdraw.filled_polygon(surf, field, env.bg_color)

    keep, ix, iy = _visible(env, cache, zoom, trans, rot)
    points = np.stack([ix, iy], axis=-1).tolist()  # (K, 4, 2) nested lists
    n_grass = len(_GRASS)
    road_poly = env.road_poly
    grass_color = env.grass_color
    for i, pts in zip(keep.tolist(), points, strict=True):
        if i < n_grass and layers.texture is not None:
            continue
        color = grass_color if i < n_grass else [int(c) for c in road_poly[i - n_grass][1]]
        gfxdraw.aapolygon(surf, pts, color)
        gfxdraw.filled_polygon(surf, pts, color)


def _world_exact(env, cache: _EnvCache, zoom: float, trans, rot, layers: variant_draw.Layers) -> np.ndarray | None:
    """The X-shrunk surviving world rows (H - HIDDEN_ROWS, 96, 3), car and a variant's blob and bars included, by
    `sim_bridges.carracing.raster`; None where its integer-range guarantees do not hold (the caller then draws with
    pygame)."""
    tiles = cache.tiles
    assert tiles is not None
    tiles.bind()  # this thread's buffers (shared by its envs)
    field_x, field_y = _field(zoom, trans, rot)  # (1, 4)
    keep, ix, iy = _visible(env, cache, zoom, trans, rot)
    if not raster.poly_in_range(ix, iy):
        return None
    # Road colours change in place when a wheel touches a tile: read them every frame, as `int()` does.
    n_grass = len(_GRASS)
    colours = np.empty(len(keep), np.int64)
    road_rgb = env.__dict__.get("road_rgb")  # (P, 3): the rows road_poly's colours are views of (our bridge)
    if road_rgb is None or env.__dict__.get("road_rgb_of") is not env.road_poly:  # another env: entry by entry
        road_rgb = np.array([np.asarray(c, np.float64) for _, c in env.road_poly], np.float64).reshape(-1, 3)
    if not raster.pack_road_colours(road_rgb, keep, n_grass, cache.mapped_rgb(env.grass_color), colours):
        return None
    if _fill_covers_visible_rows(field_x[0], field_y[0]):
        bg = cache.mapped_rgb(env.bg_color)
    elif raster.poly_in_range(field_x, field_y):
        bg = 0  # a fresh surface, then the background polygon like any other
        ix, iy = np.concatenate([field_x, ix]), np.concatenate([field_y, iy])
        colours = np.concatenate([[cache.mapped_rgb(env.bg_color)], colours])
    else:
        return None
    if not raster.draw_world(ix, iy, colours, bg, tiles.canvas()):
        return None

    car = view.car_screen(env.car, zoom, trans, rot)
    if car is None or not raster_car.draw_car(*car, tiles.canvas()):
        return None
    if not variant_draw.on_tiles(layers, tiles.canvas()):
        return None
    world = tiles.frame[: H - HIDDEN_ROWS]
    shrink.shrink_rows(tiles.canvas(), tiles.xc, tiles.xfrac, tiles.xrecip, tiles.shift, tiles.saturate, world)
    return world


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

    rot = view.rotation(angle)
    variant = env.__dict__.get("episode_variant")  # a CarRacingExtension variant (sim_bridges.carracing.variants)
    layers = variant_draw.NO_LAYERS if variant is None else variant.layers(env.car, zoom, trans, angle)
    exact = cache.tiles is not None and layers.texture is None  # a texture: the pygame path (variant_draw)
    world = _world_exact(env, cache, zoom, trans, rot, layers) if exact else None
    if world is None:
        _draw_world(cache.canvas, env, cache, zoom, trans, rot, layers)
        env.car.draw(cache.canvas, zoom, trans, angle, False)
        variant_draw.on_surface(layers, cache.canvas)

    # Stock: flip, paint the bar over rows H-100.. (opaque: rows 0..99 of the unflipped world never show),
    # smoothscale. Same pixels: X-shrink the surviving world rows, flip those 96-wide rows, stack the X-shrunk
    # bar under them (`sim_bridges.carracing.indicators`), then let smoothscale's Y pass (X untouched at equal width)
    # finish the frame. `env.surf` is the bar surface, drawn only where the pygame path runs.
    env.surf = cache.bar
    score = f"{env.reward:04.0f}"
    tiles = cache.tiles
    if world is not None and tiles is not None and indicators.shrink_bar(tiles, env, score, cache.canvas):
        return _finish_exact(tiles)
    env._render_indicators(W, H)
    text = _Fonts.text(score)
    text_rect = text.get_rect()
    text_rect.center = (60, H - H * 2.5 / 40.0)
    env.surf.blit(text, text_rect)
    if world is not None and tiles is not None:
        _shrink_bar_pixels(tiles, cache.bar)
        return _finish_exact(tiles)
    return _finish_pygame(cache)


def _shrink_bar_pixels(tiles: _Tiles, bar_surface: pygame.Surface) -> None:
    """X-shrink the bar rows drawn by stock code on `bar_surface` into `tiles.bar_rows`."""
    tiles.bar_key = None
    bar = pygame.surfarray.pixels2d(bar_surface)[:, H - HIDDEN_ROWS :].T  # (HIDDEN_ROWS, W) view
    shrink.shrink_pixels(
        bar,
        tiles.t_start,
        tiles.t_end,
        tiles.xc,
        tiles.xfrac,
        tiles.xrecip,
        tiles.shift,
        tiles.saturate,
        tiles.bar_rows,
    )
    del bar  # unlocks the surface


def _finish_exact(tiles: _Tiles) -> np.ndarray:
    """smoothscale's Y pass over `tiles.frame` (X-shrunk world rows, flipped, then this env's bar rows): the frame."""
    tiles.frame[H - HIDDEN_ROWS :] = tiles.bar_rows
    shrink.shrink_columns(
        tiles.frame,
        tiles.r_start,
        tiles.r_end,
        tiles.yc,
        tiles.yfrac,
        tiles.yrecip,
        tiles.shift,
        tiles.saturate,
        tiles.out,
    )
    return tiles.out.reshape(cr.STATE_H, cr.STATE_W, 3).copy()


def _finish_pygame(cache: _EnvCache) -> np.ndarray:
    """The same with pygame's smoothscale, from the world drawn on `cache.canvas`."""
    pygame.transform.smoothscale(cache.bar_vis, cache.bar_x.get_size(), cache.bar_x)
    pygame.transform.smoothscale(cache.canvas_vis, cache.world_x.get_size(), cache.world_x)
    cache.frame_x.blit(pygame.transform.flip(cache.world_x, False, True), (0, 0))
    cache.frame_x.blit(cache.bar_x, (0, H - HIDDEN_ROWS))
    pygame.transform.smoothscale(cache.frame_x, STATE_SIZE, cache.small)
    rgb = pygame.image.tobytes(cache.small, "RGB")
    return np.frombuffer(rgb, dtype=np.uint8).reshape(cr.STATE_H, cr.STATE_W, 3).copy()
