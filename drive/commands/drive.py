"""`drive drive`: a trained controller drives live with the uncertainty overlay (pygame window; an mp4 headless).

drive drive --ckpt runs/bc-nsac/best.pt            # default: the shipped checkpoints/carracing_nsac.pt
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from drive.errors import UserError
from drive.loop.options import SHIPPED_CONTROLLER, SHIPPED_HINT
from drive.loop.seeds import parse_seeds
from drive.options import NonNegativeFloat, NonNegativeInt, PositiveInt


@dataclass(frozen=True)
class Config:
    ckpt: Annotated[Path, SHIPPED_HINT] = SHIPPED_CONTROLLER
    """the trained controller's checkpoint that drives"""
    seeds: str = "1000"
    """track seeds to drive, one episode each: 'A-B' (inclusive), 'A,B,C'"""
    samples: PositiveInt | None = None
    """stochastic samples per step (default: the controller's own)"""
    shadow: str | None = None
    """shadow expert acting on the privileged state every step (ppo, pursuit, PATH; default: the expert that labelled
    the controller's training data, as in drive eval; none: off)"""
    fallback: Literal["off", "expert", "slow"] = "off"
    """uncertainty-gated fallback: off, expert (the shadow expert takes over) or slow (slow down)"""
    fallback_threshold: NonNegativeFloat | None = None
    """epistemic-variance threshold (default: stored in the checkpoint, else calibrated on --calibrate-seeds)"""
    calibrate_seeds: str = "2000-2002"
    """nominal laps used to calibrate the fallback threshold when none is stored or given"""
    video: Path = Path("out/drive.mp4")
    """video written instead of the window when headless"""
    headless: bool | None = None
    """force (true) or forbid (false) headless mode; default: detect from SDL_VIDEODRIVER / DISPLAY"""
    trace: Path | None = None
    """also record the interpretability trace of each episode into this directory"""
    fps: PositiveInt = 50
    """window refresh / video frames per second"""
    max_episode_steps: PositiveInt = 1000
    """step limit per episode"""
    env: Literal["carracing", "fake-road"] = "carracing"
    """simulator: carracing, or fake-road (tests; its shadow expert is 'pursuit')"""
    seed: NonNegativeInt = 0
    """seed of the controller's sampling"""


def run(cfg: Config) -> int:
    # the engine, imported when the command runs: `drive drive --help` must not load torch or the simulator
    from drive.loop.envs import make_env
    from drive.loop.rollout import rollout
    from drive.loop.specs import controller_policy, default_shadow
    from drive.loop.thresholds import fallback_for_command
    from drive.observe.trace_recorder import TraceRecorder
    from drive.observe.window import StopDriving, Window, is_headless

    path = str(cfg.ckpt)
    if cfg.fps < 1:
        raise UserError(f"--fps must be >= 1, got {cfg.fps}")
    seeds = parse_seeds(cfg.seeds)
    fallback, threshold, origin = fallback_for_command(cfg, path)
    if fallback is not None:
        print(f"fallback threshold {threshold:.4g} ({origin})")
    shadow = default_shadow(cfg.shadow, cfg.env, path)
    policy = controller_policy(path, cfg.samples, cfg.seed, shadow, fallback, threshold, cfg.env)
    env = make_env(cfg.env, max_episode_steps=cfg.max_episode_steps)
    window = Window(is_headless() if cfg.headless is None else cfg.headless, cfg.video, cfg.fps)
    observers: list[Any] = [window]
    if cfg.trace is not None:
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
        print(
            f"seed {result.seed}: return {result.return_:.1f}, {result.tiles}/{result.n_tiles} tiles, "
            f"{result.off_track_events} off-track events{extra}"
        )
    if written is not None:
        print(f"headless: wrote {written}")
    if cfg.trace is not None:
        print(f"traces in {cfg.trace}")
    return 0
