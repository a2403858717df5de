"""Camera perturbations of raw CarRacing frames: the same functions offline (`drive ood`) and in closed loop
(`drive eval --perturb`), applied to the raw (96, 96, 3) RGB frame before the one frame coder (datasets/frames.py).

Kinds and the unit of their level (`KIND:LEVEL`, e.g. `noise:0.1`, `blur:2`, `occlusion:0.1`, `brightness:0.5`):
- `noise`: additive Gaussian pixel noise, std in [0, 1] pixel units (1 = the whole 0..255 range), fresh per frame;
- `blur`: Gaussian blur, sigma in pixels of the 96x96 frame, >= 0;
- `occlusion`: a black square covering this fraction of the frame, in [0, 1), placed at random once per episode
  (dirt on the lens: it stays where it is while the car drives);
- `brightness`: every pixel multiplied by this factor (clipped), >= 0 (1: unchanged);
- `motion_blur`, `fog`, `darkness`, `jpeg`, `rain`, `hue`: the held-out families of drive/perturb/held_out.py (its
  docstring gives each level's unit and range; all deterministic but `rain`, whose streaks are fresh per frame);
- `domain_randomize` (no level): CarRacing's own `domain_randomize` colours (`domain_colours`, drawn as
  gymnasium's `CarRacing._reinit_colors` draws them: road and background uniform in [0, 210) per channel, grass =
  background + 20 in one channel), once per episode. These change the world, not the frame: the closed loop sets
  them on the env after the track is built (drive/perturb/wrappers.py), so the track is the one the seed names.

`FunctionPerturber` runs any frame function `(frame, level, rng) -> frame` (a user's plug-in) the same way and
checks that it returns a raw frame.

Randomness is per episode: `FramePerturber.reset(seed)` seeds it from (perturbation seed, track seed), so a rerun
of an episode sees the same perturbed frames. Never imports `drive`, `agents` or `sim_bridges`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from drive.perturb.held_out import FAMILIES, FrameFn

RAW_SHAPE = (96, 96, 3)
#: kind -> what its level means
KINDS = {
    "noise": "Gaussian pixel noise std in [0, 1] pixel units",
    "blur": "Gaussian blur sigma in pixels",
    "occlusion": "black square, fraction of the frame area",
    "brightness": "brightness factor",
    **{kind: family.unit for kind, family in FAMILIES.items()},
    "domain_randomize": "CarRacing's domain_randomize colours (no level)",
}
WORLD_KINDS = ("domain_randomize",)  # perturb the simulated world, not the frame


@dataclass(frozen=True)
class Perturbation:
    kind: str
    level: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"perturbation {self.kind!r}: choose one of {sorted(KINDS)}")
        bad = {
            "noise": not 0.0 <= self.level <= 1.0,
            "blur": self.level < 0,
            "occlusion": not 0.0 <= self.level < 1.0,
            "brightness": self.level < 0,
        }.get(self.kind, False)
        if self.kind in FAMILIES and math.isfinite(self.level):
            bad = not FAMILIES[self.kind].valid(self.level)
        if bad or not math.isfinite(self.level):
            raise ValueError(f"perturbation {self}: level out of range ({KINDS[self.kind]})")

    def __str__(self) -> str:
        return self.kind if self.kind in WORLD_KINDS else f"{self.kind}:{self.level:g}"


def parse_perturbation(text: str) -> Perturbation:
    """'noise:0.1' -> Perturbation('noise', 0.1); 'domain_randomize' takes no level."""
    kind, sep, level = text.strip().partition(":")
    if kind in WORLD_KINDS:
        if sep:
            raise ValueError(f"perturbation {text!r}: {kind} takes no level")
        return Perturbation(kind)
    if kind not in KINDS:
        raise ValueError(f"perturbation {text!r}: choose one of {sorted(KINDS)}")
    if not sep:
        raise ValueError(f"perturbation {text!r}: give KIND:LEVEL ({kind}: {KINDS[kind]})")
    try:
        value = float(level)
    except ValueError:
        raise ValueError(f"perturbation {text!r}: level {level!r} is not a number") from None
    return Perturbation(kind, value)


def parse_perturbations(text: str) -> tuple[Perturbation, ...]:
    """'noise:0.1,blur:2,domain_randomize' -> the three perturbations."""
    items = [part for part in text.split(",") if part.strip()]
    if not items:
        raise ValueError("no perturbation given (KIND:LEVEL[,...])")
    return tuple(parse_perturbation(part) for part in items)


def domain_colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(road, background, grass) colours exactly as gymnasium's CarRacing._reinit_colors(randomize=True) draws them."""
    road = rng.uniform(0, 210, size=3)
    background = rng.uniform(0, 210, size=3)
    grass = np.copy(background)
    grass[rng.integers(3)] += 20
    return road, background, grass


class FramePerturber:
    """One perturbation of raw frames, episode by episode: `reset(seed)`, then call it on each raw frame."""

    def __init__(self, perturbation: Perturbation, seed: int = 0):
        self.perturbation, self.seed = perturbation, int(seed)
        self.reset()

    def reset(self, episode_seed: int | None = None) -> None:
        self.rng = np.random.default_rng([self.seed, 0 if episode_seed is None else int(episode_seed)])
        p = self.perturbation
        self.patch: tuple[int, int, int] | None = None
        if p.kind == "occlusion" and p.level > 0:
            side = max(1, round(math.sqrt(p.level * RAW_SHAPE[0] * RAW_SHAPE[1])))
            top, left = (int(self.rng.integers(0, RAW_SHAPE[i] - side + 1)) for i in range(2))
            self.patch = (top, left, side)
        self.colours = domain_colours(self.rng) if p.kind == "domain_randomize" else None

    def __call__(self, rgb96: np.ndarray) -> np.ndarray:
        """(96, 96, 3) uint8 -> (96, 96, 3) uint8, perturbed (world kinds: unchanged, the env draws them)."""
        frame = np.asarray(rgb96)
        if frame.shape != RAW_SHAPE or frame.dtype != np.uint8:
            raise ValueError(f"a raw CarRacing frame is {RAW_SHAPE} uint8, got {frame.shape} {frame.dtype}")
        kind, level = self.perturbation.kind, self.perturbation.level
        if kind == "noise" and level > 0:
            noisy = frame + self.rng.normal(0.0, level * 255.0, frame.shape)
            return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
        if kind == "blur" and level > 0:
            return cv2.GaussianBlur(frame, (0, 0), sigmaX=level, sigmaY=level, borderType=cv2.BORDER_REFLECT)
        if kind == "occlusion" and self.patch is not None:
            top, left, side = self.patch
            out = frame.copy()
            out[top : top + side, left : left + side] = 0
            return out
        if kind == "brightness":
            return np.clip(np.rint(frame * np.float32(level)), 0, 255).astype(np.uint8)
        if kind in FAMILIES:
            return FAMILIES[kind].apply(frame, level, self.rng)
        return frame


def check_frame(frame: np.ndarray, name: str) -> np.ndarray:
    """`frame` if it is a raw CarRacing frame ((96, 96, 3) uint8), else a ValueError naming `name`."""
    if not isinstance(frame, np.ndarray) or frame.shape != RAW_SHAPE or frame.dtype != np.uint8:
        got = f"{frame.shape} {frame.dtype}" if isinstance(frame, np.ndarray) else type(frame).__name__
        raise ValueError(f"{name} returned {got}; a camera perturbation must return a {RAW_SHAPE} uint8 frame")
    return frame


class FunctionPerturber:
    """A frame function `fn(frame, level, rng) -> frame` as a perturber, seeded per episode as FramePerturber is
    (`rng` from (seed, episode seed)); it gets a copy of each frame, and what it returns is checked (`name` in the
    error)."""

    colours = None  # a camera perturbation: the world keeps its colours

    def __init__(self, fn: FrameFn, level: float, seed: int = 0, name: str = ""):
        self.fn, self.level, self.seed = fn, float(level), int(seed)
        self.name = name or getattr(fn, "__qualname__", repr(fn))
        self.reset()

    def reset(self, episode_seed: int | None = None) -> None:
        self.rng = np.random.default_rng([self.seed, 0 if episode_seed is None else int(episode_seed)])

    def __call__(self, rgb96: np.ndarray) -> np.ndarray:
        return check_frame(self.fn(np.array(rgb96, np.uint8), self.level, self.rng), self.name)
