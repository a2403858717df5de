"""CarRacingExtension's generalisation variants of CarRacing: Color, Color3, Bar, Blob, Noise, Video.

Source: Y. Tang, D. Nguyen, D. Ha, "Neuroevolution of Self-Interpretable Agents", GECCO 2020
(https://attentionagent.github.io); repository google/brain-tokyo-workshop, folder CarRacingExtension
(`car_racing_variants/car_racing.py`, `car_dynamics.py`). An agent trained on the clean env is tested on these
without retraining (AttentionAgent, World Models, PPO and GA scores are in that folder's README). Their spec, colours
in [0, 1] units as theirs are:

- color: two scalars from U(-0.2, 0.2), drawn at reset, one added to every channel of the road colour, one to the
  grass colour; color3: the same with two 3-vectors (one value per RGB channel);
- bar: black vertical bars at the left and right of the view, each 3/40 of the window wide, from the indicator bar
  to the top;
- blob: a red (0.8, 0, 0) square of 8 x 8 world units fixed in the car's frame: its corner 20 units right and 10
  forward of the first vertex of the hull's fourth polygon (HULL_POLY4's rear corner, (1.0, -2.4) in the hull's
  frame as Box2D stores it), transformed like the car's polygons, so it turns with the car;
- noise: the grass replaced by an image of uniform RGB noise (one texel per world unit over the playfield), drawn
  afresh every frame; the road and its kerbs are drawn over it;
- video: the grass replaced by the frames of a user's video, one per rendered frame, looped (the first at reset).

Here a `Variant` names one (`parse_variant`: ``color``, ``color3``, ``bar``, ``blob``, ``noise``, ``video=DIR`` with
DIR a folder of PNG frames, read in the order of the number in their names, else of the names). The bridge
(`sim_bridges.carracing.bridge.CarRacingBridge(variant=...)`) starts an `EpisodeVariant` at every reset, its randomness
seeded from (variant seed, reset seed) apart from the track's RNG, so a seed names the same track with and without
a variant and a rerun draws the same pixels; a reset without a seed continues the stream. Colours are set on the env
before the track is built; the other layers are drawn by our renderer, `sim_bridges.carracing.fast_render`, at the step
where each belongs (`sim_bridges.carracing.variant_draw` says how). Everything else is drawn as on the clean env, to the
pixel.

Departures from theirs:
- the env is gymnasium's CarRacing-v3 (pygame, colours 0..255: offsets are +-0.2 * 255) where theirs is gym's v0
  (OpenGL); v3 turns the view with the hull, theirs with the velocity above 0.5 m/s, so our blob keeps its place on
  the screen;
- colour: theirs names the field colour `grass_color` and draws the lighter grass patches in a fixed (0.4, 0.9, 0.4);
  gymnasium names the field `bg_color` and the patches `grass_color`. As theirs, the offset moves the field and the
  road (stock shading per tile kept; the kerbs keep their colours), not the patches; colours are clipped to 0..255;
- noise: a 666 x 666 texture over the playfield (+-PLAYFIELD; theirs 666 texels of one world unit centred on the
  origin, 0.1 % narrower), bilinear (GL_LINEAR, pyglet's default); theirs draws from numpy's global RNG;
- video: a frame is stretched over the playfield square (theirs draws it at one pixel per world unit around the
  origin: a 666 x 666 frame maps alike); the k-th frame drawn since reset (reset's own is k = 0) shows frame
  k modulo their count in playing order (theirs reads `{(k + 1) % count}.png`, from `CARRACING_VIDEO_DIR`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from sim_bridges.carracing import variant_draw

KINDS = ("color", "color3", "bar", "blob", "noise", "video")
COLOUR_KINDS = ("color", "color3")
OFFSET = 0.2 * 255  # +-0.2 in [0, 1] units
NOISE_TEXELS = 666  # int(2 * PLAYFIELD): theirs, one texel per world unit
# gymnasium CarRacing._init_colors's defaults (domain_randomize off)
ROAD, FIELD, GRASS = np.array([102.0] * 3), np.array([102.0, 204.0, 102.0]), np.array([102.0, 230.0, 102.0])
_VIDEO_CACHE_BYTES = 256 << 20  # decoded video frames kept in memory; the rest are read from disk when shown


@dataclass(frozen=True)
class Variant:
    """One variant: `kind` (KINDS), the PNG folder of `video`, the `seed` its randomness is drawn from (with the
    reset seed)."""

    kind: str
    video_dir: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"CarRacing variant {self.kind!r}: choose one of {KINDS} (video as video=DIR)")
        if (self.kind == "video") != (self.video_dir is not None):
            raise ValueError(
                f"CarRacing variant {self.kind!r}: video takes a folder of PNG frames (video=DIR, or "
                "video_dir=DIR in gymnasium.make), the other variants none"
            )

    def __str__(self) -> str:
        return f"video={self.video_dir}" if self.kind == "video" else self.kind


def parse_variant(text: str, seed: int = 0) -> Variant:
    """'color3' -> Variant('color3'); 'video=DIR' -> Variant('video', 'DIR') once DIR is found to hold PNG frames."""
    kind, sep, folder = text.strip().partition("=")
    variant = Variant(kind, folder if sep else None, seed)
    if variant.video_dir is not None:
        video_frames(variant.video_dir)
    return variant


def _frame_order(path: Path) -> tuple:
    number = re.search(r"\d+", path.stem)
    return (0, int(number.group()), path.name) if number else (1, 0, path.name)


def video_frames(folder: str) -> list[Path]:
    """The PNG frames of `folder` in playing order (the first number in each name, then the name)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ValueError(f"CarRacing video variant: {folder!r} is not a folder")
    paths = sorted(root.glob("*.png"), key=_frame_order)
    if not paths:
        raise ValueError(f"CarRacing video variant: no PNG frames in {folder!r}")
    return paths


class VideoFrames:
    """A folder's frames as textures (`variant_draw.as_texture`), frame k at k modulo their count, decoded on first
    use and kept up to `_VIDEO_CACHE_BYTES` (a longer video is read from disk again when it loops)."""

    def __init__(self, folder: str):
        self.paths = video_frames(folder)
        self.kept: dict[int, np.ndarray] = {}
        self.kept_bytes = 0

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, k: int) -> np.ndarray:
        k %= len(self.paths)
        frame = self.kept.get(k)
        if frame is None:
            bgr = cv2.imread(str(self.paths[k]), cv2.IMREAD_COLOR)
            if bgr is None:
                raise ValueError(f"CarRacing video variant: cannot read {self.paths[k]}")
            frame = variant_draw.as_texture(bgr)
            if self.kept_bytes + frame.nbytes <= _VIDEO_CACHE_BYTES:
                self.kept[k] = frame
                self.kept_bytes += frame.nbytes
        return frame


def variant_rng(variant: Variant, seed: int | None) -> np.random.Generator:
    """The variant's RNG for an episode reset with `seed`: its own stream, apart from the track's."""
    return np.random.default_rng([variant.seed, 0 if seed is None else int(seed)])


class EpisodeVariant:
    """One episode under a variant: its colours, drawn at the start, and what each frame adds (`layers`)."""

    def __init__(self, variant: Variant, rng: np.random.Generator, video: VideoFrames | None = None):
        self.variant, self.rng, self.video = variant, rng, video
        if variant.kind == "video" and video is None:
            raise ValueError("CarRacing video variant: give the episode its VideoFrames")
        self.n_frames = 0
        n = 3 if variant.kind == "color3" else 1
        self.road_offset, self.field_offset = np.zeros(3), np.zeros(3)
        if variant.kind in COLOUR_KINDS:  # theirs: road first, then grass
            self.road_offset = np.broadcast_to(rng.uniform(-0.2, 0.2, n) * 255, (3,)).copy()
            self.field_offset = np.broadcast_to(rng.uniform(-0.2, 0.2, n) * 255, (3,)).copy()

    def colours(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(road, field = gymnasium's bg_color, grass patches) in 0..255 (see the module docstring)."""
        return np.clip(ROAD + self.road_offset, 0, 255), np.clip(FIELD + self.field_offset, 0, 255), GRASS.copy()

    def noise(self, zoom: float, trans, angle: float) -> tuple[np.ndarray, np.ndarray]:
        """This frame's noise texture and its map: fresh uniform B, G, R bytes (0x00RRGGBB pixels) for the texels of
        the 666 x 666 image the view can sample (`variant_draw.texel_window`), the rest never drawn."""
        shape = (NOISE_TEXELS, NOISE_TEXELS)
        tmap = variant_draw.texture_map(shape, zoom, trans, angle)
        v0, v1, u0, u1 = variant_draw.texel_window(shape, tmap)
        pixels = self.rng.integers(0, 1 << 24, (max(v1 - v0, 1), max(u1 - u0, 1)), np.uint32).astype("<u4", copy=False)
        tmap[:, 2] -= (u0, v0)
        return pixels.view(np.uint8).reshape(*pixels.shape, 4), tmap

    def layers(self, car, zoom: float, trans, angle: float) -> variant_draw.Layers:
        """What the renderer adds to this frame, in screen terms of the frame's view; one call per rendered frame."""
        kind = self.variant.kind
        texture = tmap = None
        if kind == "noise":
            texture, tmap = self.noise(zoom, trans, angle)
        elif kind == "video":
            assert self.video is not None
            texture = self.video[self.n_frames]
            tmap = variant_draw.texture_map(texture.shape, zoom, trans, angle)
        self.n_frames += 1
        blob = variant_draw.blob_screen(car, zoom, trans, angle) if kind == "blob" else None
        return variant_draw.Layers(texture, tmap, blob, kind == "bar")
