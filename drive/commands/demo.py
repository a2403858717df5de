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
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from drive.errors import UserError
from drive.loop.options import SHIPPED_CONTROLLER, CollectOptions, EvalOptions
from drive.options import IntRange, NonNegativeInt, PositiveInt, Workers, drive_program

log = logging.getLogger(__name__)

Scale: Any = IntRange(1, 16)  # an option type (a range-checked int), like drive.options.PositiveInt
RESUMES = True  # rerunning the same command continues what an interrupted run left

PLOTS = {"map": "the track coloured by phi, kappa, psi, logits, epistemic variance",
         "timeseries": "steering +-2 sigma, epistemic variance and gates over time"}  # fmt: skip


@dataclass(frozen=True)
class Config:
    out: Path = Path("out/demo")
    """output directory: demonstrations/ (the dataset), expert.mp4, trace/ (the controller's trace and plots) and
    controller.mp4"""
    expert: str = "ppo"
    """expert that drives: ppo (shipped), pursuit, or a path to an expert checkpoint"""
    episodes: PositiveInt = 2
    """number of demonstrations to record"""
    seeds: str | None = None
    """track seeds of the demonstrations ('A-B' inclusive or 'A,B,C'; default 0..episodes-1)"""
    workers: Workers = min(2, os.cpu_count() or 1)
    """parallel worker processes for the recording"""
    video_steps: PositiveInt = 600
    """length of the video in steps (50 steps per second of driving)"""
    scale: Scale = 4
    """video upscale factor of the 96x96 frames"""
    max_episode_steps: PositiveInt = 1000
    """step limit per episode"""
    env: Literal["carracing", "fake-road"] = "carracing"
    """simulator: carracing, or fake-road (a tiny synthetic road for tests)"""
    ckpt: Path | None = SHIPPED_CONTROLLER
    """trained controller's checkpoint that then drives an unseen track with the uncertainty overlay (None: skip this
    part)"""
    track: NonNegativeInt = 1000
    """track seed the controller drives (the controllers are trained on seeds < 1000)"""
    controller_steps: PositiveInt | None = None
    """step limit of the controller's episode (default: --max-episode-steps)"""
    progress: bool = True
    """show progress bars"""


def render_video(episode, path: Path, n_steps: int, scale: int, title: str) -> int:
    """Write the episode's raw frames (upscaled, with speed and action overlaid) to `path`; returns frames written."""
    from datasets.demonstrations import DemonstrationError
    from drive.observe.video import VideoWriter, put_lines, upscale

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
    # the engine, imported when the command runs: `drive demo --help` must not load torch or the simulator
    from datasets.demonstrations import Demonstrations
    from drive import checkpoint
    from drive.loop.collect import collect
    from drive.observe.demonstrations import recorder_for

    if cfg.episodes < 1:
        raise UserError(f"--episodes must be >= 1, got {cfg.episodes}")
    if cfg.ckpt is not None:  # a bad checkpoint fails before anything is recorded
        checkpoint.read(cfg.ckpt, kind="controller")
    n_steps = 1 if cfg.ckpt is None else 2
    print(f"drive demo: {n_steps} step(s), every output goes into {cfg.out}/")
    data_dir = cfg.out / "demonstrations"
    options = CollectOptions(
        out=data_dir,
        expert=cfg.expert,
        episodes=cfg.episodes,
        seeds=cfg.seeds,
        workers=cfg.workers,
        keep_raw=True,
        max_episode_steps=cfg.max_episode_steps,
        env=cfg.env,
        progress=cfg.progress,
    )
    print(
        f"step 1/{n_steps}: the {cfg.expert} expert drives {cfg.episodes} track(s) of {cfg.env} (it sees the "
        "privileged state); its demonstrations are recorded"
    )
    summary = collect(options, recorder_for)
    dataset = Demonstrations(data_dir, include_flagged=True)
    episode = dataset.load(summary.seeds[0])
    for record in dataset.episodes:
        if int(record["seed"]) in summary.seeds:
            flag = " (flagged: below min_return, left out when training)" if record["flagged"] else ""
            print(
                f"  track {record['seed']}: return {record['return']:.1f}, {record['completion']:.0%} of the lap, "
                f"{record['steps']} steps{flag}"
            )
    video_path = cfg.out / "expert.mp4"
    n = render_video(episode, video_path, cfg.video_steps, cfg.scale, f"{cfg.expert} expert, track {episode.seed}")
    done = f"{summary.frames} frames recorded" if summary.new else "already recorded, kept"
    print(f"  dataset: {data_dir} ({done}; `drive data info` describes it)")
    print(f"  video:   {video_path} ({n / 50:.1f} s of the expert on track {episode.seed})")
    if cfg.ckpt is None:
        return 0
    return drive_controller(cfg, cfg.ckpt)


def _as_typed(path: Path) -> Path:
    """The path relative to the working directory when inside it (the shipped default is absolute), else as is."""
    try:
        return path.relative_to(Path.cwd()) if path.is_absolute() else path
    except ValueError:
        return path


def drive_controller(cfg: Config, ckpt: Path) -> int:
    """Part 2: the trained controller on an unseen track, traced, plotted and replayed with the overlay."""
    from drive.loop.evaluate import evaluate
    from drive.observe.replay import replay
    from drive.observe.trace_recorder import trace_observer

    trace_dir = cfg.out / "trace"
    # failure_horizon=0: failure prediction scores a signal against off-track / spin / stall events over many laps
    # (and first runs 5 nominal laps for its thresholds); on the demo's one lap it has nothing to score
    options = EvalOptions(
        policy=f"ckpt:{ckpt}",
        seeds=str(cfg.track),
        env=cfg.env,
        progress=cfg.progress,
        max_episode_steps=cfg.controller_steps or cfg.max_episode_steps,
        failure_horizon=0,
    )
    name = _as_typed(ckpt)
    print(
        f"step 2/2: the trained controller {name} drives track {cfg.track}, unseen in training, from pixels\n"
        "          (the expert rides along in shadow mode; the recorder keeps what the model computes each step)"
    )
    results = evaluate(options, functools.partial(trace_observer, trace_dir))
    episode = results["episodes"][0]
    lap = "lap finished" if episode["lap_finished"] else f"{episode['completion']:.0%} of the lap driven"
    print(
        f"  return {episode['return']:.1f}, {lap}, {episode['steps']} steps, "
        f"{episode['off_track_events']} time(s) off the track"
    )
    if "coverage90_steer" in results:
        print(
            f"  the expert's steering lay inside the controller's 90 % interval on {results['coverage90_steer']:.0%}"
            " of the steps"
        )
    trace = trace_dir / f"trace_seed{cfg.track:06d}.parquet"
    print(f"  trace:   {trace} (each step: actions, uncertainties, kappa, phi, psi per head)")
    for plot in sorted(trace_dir.glob(f"{trace.stem}_*.png")):  # drawn by the recorder when the episode ended
        print(f"  plot:    {plot} ({PLOTS.get(plot.stem.rsplit('_', 1)[1], 'plot')})")
    video_path = cfg.out / "controller.mp4"
    n = replay(trace, video_path, every=2)
    print(f"  video:   {video_path} ({n / 50:.1f} s: the drive at double speed, uncertainty overlaid)")
    drive = drive_program()
    print(f"next: {drive} eval --ckpt {shlex.quote(str(name))} --seeds 1000-1019   |   {drive} drive")
    return 0
