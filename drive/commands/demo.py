"""`drive demo`: the main job on the embedded default, no download, no server.

1. The shipped PPO expert drives CarRacing on a few tracks while `drive collect` records its demonstrations (raw
   frames kept); the first recorded episode is read back through the dataset reader and rendered as an mp4 of the
   expert driving (raw 96x96 frames upscaled, speed and action overlaid). Rerunning resumes: finished episodes are
   kept.
2. The shipped NSAC controller (checkpoints/carracing_nsac.pt, behaviour-cloned from pixels; model card beside it)
   drives a track it never saw, closed loop, with the expert in shadow mode and the interpretability recorder on
   (`drive eval --trace`): the trace (Parquet), its plots (track maps coloured by kappa, phi, psi, the logits and the
   epistemic variance) and `drive replay`'s video with the uncertainty overlay land in the output directory.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from datasets.demonstrations import DemonstrationError, Demonstrations
from drive import checkpoint
from drive.errors import UserError
from drive.loop.collect import CollectOptions, collect
from drive.loop.evaluate import EvalOptions, describe, evaluate
from drive.loop.specs import SHIPPED_CONTROLLER
from drive.observe.demonstrations import recorder_for
from drive.observe.replay import replay
from drive.observe.trace_recorder import trace_observer
from drive.observe.video import VideoWriter, put_lines, upscale
from drive.options import IntRange, NonNegativeInt, PositiveInt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    out: Path = Path("out/demo")
    """output directory: demonstrations/ (the dataset) and expert.mp4"""
    expert: str = "ppo"
    """expert that drives: ppo (shipped), pursuit, or a path to an expert checkpoint"""
    episodes: PositiveInt = 2
    """number of demonstrations to record"""
    seeds: str | None = None
    """track seeds of the demonstrations ('A-B' inclusive or 'A,B,C'; default 0..episodes-1)"""
    workers: PositiveInt = min(2, os.cpu_count() or 1)
    """parallel worker processes for the recording"""
    video_steps: PositiveInt = 600
    """length of the video in steps (50 steps per second of driving)"""
    scale: IntRange(1, 16) = 4
    """video upscale factor of the 96x96 frames"""
    max_episode_steps: PositiveInt = 1000
    """step limit per episode"""
    env: Literal["carracing", "fake-road"] = "carracing"
    """simulator: carracing, or fake-road (a tiny synthetic road for tests)"""
    controller: Path | None = SHIPPED_CONTROLLER
    """trained controller that then drives an unseen track with the uncertainty overlay (None: skip this part)"""
    track: NonNegativeInt = 1000
    """track seed the controller drives (the controllers are trained on seeds < 1000)"""
    controller_steps: PositiveInt | None = None
    """step limit of the controller's episode (default: --max-episode-steps)"""
    progress: bool = True
    """show progress bars"""


def render_video(episode, path: Path, n_steps: int, scale: int, title: str) -> int:
    """Write the episode's raw frames (upscaled, with speed and action overlaid) to `path`; returns frames written."""
    if episode.raw is None:
        raise DemonstrationError(f"{episode.meta['file']}: recorded without raw frames (collect with --keep-raw)")
    n = min(n_steps, len(episode))
    with VideoWriter(path, fps=50) as video:
        for t in range(n):
            frame = upscale(episode.raw[t], scale)
            steer, gas, brake = episode.action[t]
            put_lines(
                frame,
                [
                    title,
                    f"t {t / 50:5.2f} s   speed {episode.speed[t]:5.1f}",
                    f"steer {steer:+.2f}  gas {gas:.2f}  brake {brake:.2f}",
                ],
            )
            video.write(frame)
    return n


def run(cfg: Config) -> int:
    if cfg.episodes < 1:
        raise UserError(f"--episodes must be >= 1, got {cfg.episodes}")
    if cfg.controller is not None:  # a bad checkpoint fails before anything is recorded
        checkpoint.read(cfg.controller, kind="controller")
    data_dir = cfg.out / "demonstrations"
    options = CollectOptions(out=data_dir, expert=cfg.expert, episodes=cfg.episodes, seeds=cfg.seeds,
                             workers=cfg.workers, keep_raw=True, max_episode_steps=cfg.max_episode_steps, env=cfg.env,
                             progress=cfg.progress)  # fmt: skip
    print(f"recording {cfg.episodes} demonstration(s) of the {cfg.expert} expert on {cfg.env} into {data_dir}")
    summary = collect(options, recorder_for)
    dataset = Demonstrations(data_dir, include_flagged=True)
    episode = dataset.load(summary.seeds[0])
    for record in dataset.episodes:
        if int(record["seed"]) in summary.seeds:
            flag = " (flagged: below min_return)" if record["flagged"] else ""
            print(f"  seed {record['seed']}: return {record['return']:.1f}, completion {record['completion']:.3f}, "
                  f"{record['steps']} steps{flag}")  # fmt: skip
    video_path = cfg.out / "expert.mp4"
    n = render_video(episode, video_path, cfg.video_steps, cfg.scale, f"{cfg.expert} expert, track {episode.seed}")
    done = f"{summary.frames} new frames, {summary.fps:.0f} frames/s" if summary.new else "already recorded, resumed"
    print(f"demonstrations: {data_dir} ({done})")
    print(f"video: {video_path} ({n} frames, {n / 50:.1f} s of the expert on track {episode.seed})")
    if cfg.controller is None:
        print(f"next: drive data info {data_dir}")
        return 0
    return drive_controller(cfg)


def drive_controller(cfg: Config) -> int:
    """Part 2: the trained controller on an unseen track, traced, plotted and replayed with the overlay."""
    trace_dir = cfg.out / "trace"
    options = EvalOptions(policy=f"ckpt:{cfg.controller}", seeds=str(cfg.track), env=cfg.env, progress=cfg.progress,
                          max_episode_steps=cfg.controller_steps or cfg.max_episode_steps)  # fmt: skip
    print(f"controller {cfg.controller} drives unseen track {cfg.track} (shadow expert, recorder on)")
    results = evaluate(options, functools.partial(trace_observer, trace_dir))
    episode = results["episodes"][0]
    lap = "lap finished" if episode["lap_finished"] else f"completion {episode['completion']:.3f}"
    print(f"  return {episode['return']:.1f}, {lap}, {episode['steps']} steps, "
          f"{episode['off_track_events']} off-track events")  # fmt: skip
    print("  " + describe(results).replace("\n", "\n  "))
    trace = trace_dir / f"trace_seed{cfg.track:06d}.parquet"
    plots = sorted(trace_dir.glob(f"{trace.stem}_*.png"))  # drawn by the recorder when the episode ended
    video_path = cfg.out / "controller.mp4"
    n = replay(trace, video_path, every=2)
    print(f"trace: {trace} (+ {len(plots)} plots in {trace_dir})")
    print(f"video: {video_path} ({n} frames at 50 fps, every 2nd step, with the uncertainty overlay)")
    print(f"next: drive eval --policy ckpt:{cfg.controller} --seeds 1000-1019   |   drive drive")
    return 0
