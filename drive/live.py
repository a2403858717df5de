"""`drive drive --policy ckpt:PATH`: drive live with the uncertainty overlay.

A pygame window shows each frame with the overlay of drive/overlay.py (the same drawing `drive replay` uses):
steering mean +-2 sigma, the shadow expert's steering, aleatoric and epistemic bars, kappa/phi/psi gauges and the
fallback state. Close the window or press Esc to stop. Headless (SDL_VIDEODRIVER=dummy, or no DISPLAY /
WAYLAND_DISPLAY on Linux) there is no window: the same frames are written to `--video` instead. `--trace DIR` also
records the interpretability trace (drive/recorder.py) of each episode.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from drive.fallback import fallback_for_command
from drive.overlay import OverlayState, draw_overlay
from drive.policies import default_shadow, load_controller_policy
from drive.rollout import StepRecord, make_env, parse_seeds, rollout

log = logging.getLogger(__name__)

DEFAULT_CKPT = Path(__file__).resolve().parents[1] / "checkpoints" / "carracing_nsac.pt"


@dataclass(frozen=True)
class Config:
    policy: str = f"ckpt:{DEFAULT_CKPT}"
    """the trained controller: ckpt:PATH (default: the shipped NSAC controller)"""
    seeds: str = "1000"
    """track seeds to drive, one episode each: 'A-B' (inclusive), 'A,B,C'"""
    samples: int | None = None
    """stochastic samples per step (default: the controller's own, 32 for NSAC)"""
    shadow: str | None = None
    """shadow expert acting on the privileged state every step (ppo, pursuit, PATH; default: the expert that labelled
    the controller's training data, as in drive eval; none: off)"""
    fallback: Literal["off", "expert", "slow"] = "off"
    """uncertainty-gated fallback: off, expert (the shadow expert takes over) or slow (slow down)"""
    fallback_threshold: float | None = None
    """epistemic-variance threshold (default: stored in the checkpoint, else calibrated on --calibrate-seeds)"""
    calibrate_seeds: str = "2000-2002"
    """nominal laps used to calibrate the fallback threshold when none is stored or given"""
    video: Path = Path("out/drive.mp4")
    """video written instead of the window when headless"""
    headless: bool | None = None
    """force (true) or forbid (false) headless mode; default: detect from SDL_VIDEODRIVER / DISPLAY"""
    trace: Path | None = None
    """also record the interpretability trace of each episode into this directory"""
    fps: int = 50
    """window refresh / video frames per second"""
    max_episode_steps: int = 1000
    """step limit per episode"""
    env: Literal["carracing", "fake-road"] = "carracing"
    """simulator: carracing, or fake-road (tests; its shadow expert is 'pursuit')"""
    seed: int = 0
    """seed of the controller's sampling"""


class StopDriving(Exception):
    """The window was closed."""


def is_headless() -> bool:
    if os.environ.get("SDL_VIDEODRIVER") in ("dummy", "offscreen"):
        return True
    return sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def overlay_state(record: StepRecord) -> OverlayState:
    """The overlay's view of one live step (the replay path builds the same from a trace row)."""
    extras = record.extras
    internals = extras.get("internals") or {}

    def summary(name: str) -> float | None:
        return float(np.mean(internals[name])) if name in internals else None

    def triple(values: Any) -> tuple[float, float, float] | None:
        return None if values is None else tuple(float(v) for v in np.asarray(values).reshape(-1)[:3])

    return OverlayState(
        mean=triple(extras["mean"]),
        aleatoric_var=triple(extras["aleatoric_var"]),
        epistemic_var=triple(extras["epistemic_var"]),
        expert=triple(extras.get("expert")),
        kappa=summary("kappa"),
        phi=summary("phi"),
        psi=summary("psi"),
        fallback=str(extras.get("fallback", "off")),
        fallback_score=extras.get("fallback_score"),
        fallback_threshold=extras.get("fallback_threshold"),
        fallback_signal=str(extras.get("fallback_signal", "steer")),
        t=record.t,
        speed=float(record.info.get("speed", np.nan)),
        executed=triple(record.action),
    )


def _frame(record: StepRecord) -> np.ndarray:
    raw = record.info.get("raw_frame")
    return raw if raw is not None else np.asarray(record.obs)[-1]


class Window:
    """Observer: draws each step into a pygame window (or a video when headless)."""

    def __init__(self, headless: bool, video: Path, fps: int):
        self.headless, self.fps = headless, fps
        self.video = None
        self.screen = None
        if headless:
            from drive.video import VideoWriter

            self.video = VideoWriter(video, fps=fps)
        else:
            import pygame

            pygame.init()
            pygame.display.set_caption("drive: controller with uncertainty overlay")
            self.clock = pygame.time.Clock()

    def __call__(self, record: StepRecord) -> None:
        image = draw_overlay(_frame(record), overlay_state(record))
        if self.video is not None:
            self.video.write(image)
            return
        import pygame

        if self.screen is None:
            self.screen = pygame.display.set_mode((image.shape[1], image.shape[0]))
        for event in pygame.event.get():
            if event.type == pygame.QUIT or (event.type == pygame.KEYDOWN and event.key == pygame.K_ESCAPE):
                raise StopDriving
        self.screen.blit(pygame.surfarray.make_surface(image.swapaxes(0, 1)), (0, 0))
        pygame.display.flip()
        self.clock.tick(self.fps)

    def close(self) -> Path | None:
        if self.video is not None:
            return self.video.close() if self.video.n_frames else None
        import pygame

        pygame.quit()
        return None


def run(cfg: Config) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    kind, _, path = cfg.policy.partition(":")
    if kind != "ckpt" or not path:
        print(f"drive drive: error: --policy must be ckpt:PATH, got {cfg.policy!r}", file=sys.stderr)
        return 2
    try:
        seeds = parse_seeds(cfg.seeds)
        env_kwargs = {"name": cfg.env, "keep_raw": True, "max_episode_steps": cfg.max_episode_steps}
        fallback, threshold, origin = fallback_for_command(cfg, path)
        if fallback is not None:
            print(f"fallback threshold {threshold:.4g} ({origin})")
        shadow = default_shadow(cfg.shadow, cfg.env, path)
        policy = load_controller_policy(path, cfg.samples, cfg.seed, shadow, fallback, threshold, cfg.env)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"drive drive: error: {exc}", file=sys.stderr)
        return 2
    headless = is_headless() if cfg.headless is None else cfg.headless
    env = make_env(**env_kwargs)
    window = Window(headless, cfg.video, cfg.fps)
    observers: list[Any] = [window]
    if cfg.trace is not None:
        from drive.recorder import TraceRecorder

        observers.append(TraceRecorder(cfg.trace, env=env, policy_name=policy.name))
    try:
        results = rollout(env, policy, seeds=seeds, on_step=observers)
    except StopDriving:
        results = []
        print("stopped")
    finally:
        written = window.close()
        env.close()
    for result in results:
        summary = policy.episode_summary() if result is results[-1] else {}
        extra = "".join(f", {k} {summary[k]:.3f}" for k in ("coverage90_steer", "latency_ms_p50") if k in summary)
        print(f"seed {result.seed}: return {result.return_:.1f}, {result.tiles}/{result.n_tiles} tiles, "
              f"{result.off_track_events} off-track events{extra}")  # fmt: skip
    if written is not None:
        print(f"headless: wrote {written}")
    if cfg.trace is not None:
        print(f"traces in {cfg.trace}")
    return 0
