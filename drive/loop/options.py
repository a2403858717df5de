"""The closed loop's option dataclasses (collect, evaluate, DAgger, the Udacity bridge) and the defaults they name.

They live apart from the code that runs them and import nothing heavy, because every command's `Config` is built
from them: `drive COMMAND --help` then loads no torch, gymnasium or simulator (drive/cli.py). drive/loop/collect.py,
evaluate.py, dagger.py and udacity.py take them; tests/drive/loop/test_options.py holds the defaults copied from
modules that do load heavy things equal to their source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from datasets.root import REPO
from drive.errors import UserError
from drive.options import (
    NonNegativeFloat,
    NonNegativeInt,
    OpenUnit,
    Port,
    PositiveFloat,
    PositiveInt,
    Probability,
    Workers,
)

SHIPPED_CONTROLLER = REPO / "checkpoints" / "carracing_nsac.pt"
# --help shows the shipped file as the repository names it, not as this machine's absolute path
SHIPPED_HINT = tyro.conf.arg(help_behavior_hint="(default: checkpoints/carracing_nsac.pt, the shipped NSAC)")
DEFAULT_CODING = "full"  # datasets.frames.DEFAULT_CODING: that module loads torch
DEFAULT_SERVER = "threading"  # sim_bridges.udacity.server.DEFAULT_SERVER: that module loads socket.io and OpenCV


@dataclass(frozen=True)
class CollectOptions:
    out: Path
    """dataset directory; created if new, resumed if it holds a dataset recorded with the same settings"""
    expert: str = "ppo"
    """expert that drives: ppo (shipped), pursuit (scripted), or a path to an expert checkpoint"""
    episodes: PositiveInt | None = None
    """number of episodes (default: one per seed in --seeds); without --seeds the seeds are 0..N-1"""
    seeds: str | None = None
    """track seeds: 'A-B' (inclusive), 'A,B,C' or a mix; with --episodes N the first N are used"""
    action_noise: NonNegativeFloat = 0.0
    """DART noise: std of the Gaussian added to the executed action (clipped); the label stays the clean action"""
    noise_seed: NonNegativeInt = 0
    """seed of the DART noise stream (mixed with each track seed)"""
    workers: Workers = 1
    """parallel worker processes, one episode per task (1 runs in this process); with --ray: episodes in flight"""
    ray: str | None = None
    """run the episodes as Ray tasks: local (a Ray instance here, --workers CPUs), auto (the `ray start` cluster of
    this node) or HOST:PORT; on several nodes --out must be on a filesystem all of them mount"""
    frame_coding: str = DEFAULT_CODING
    """how each frame is coded for controllers: full (the whole view, indicator bar kept) or cropped"""
    keep_raw: bool = False
    """also store the env's raw 96x96 RGB frame per step (about 3.5x the size; for videos and re-coding)"""
    min_return: float = 700.0
    """episodes returning less are flagged and left out by readers unless asked for (700: a clean lap's floor)"""
    max_episode_steps: PositiveInt = 1000
    """step limit per episode (CarRacing-v3's is 1000)"""
    frame_stack: PositiveInt = 4
    """frames in the controller's observation stack"""
    fast_render: bool = True
    """use the bridge's fast renderer (pixel-identical to stock CarRacing)"""
    env: str = "carracing"
    """simulator: carracing, or fake-road (a tiny synthetic road for tests; its expert is 'pursuit')"""
    envs: NonNegativeInt = 1
    """cars driven at once in each process (lanes), one expert call per step for all; a record does not depend on
    it. 0: 1, the least CPU per step `drive bench closedloop` measured (docs/scale.md). With K > 1 a task's
    episodes enter the manifest together, so a kill may record up to K finished episodes again"""
    progress: bool = True
    """show a progress bar with frames/s"""


def policy_spec(ckpt: Path | str | None, other: str | None, other_option: str, default: str) -> str:
    """The policy a command drives, as the loop's spec string: `ckpt:PATH` from `--ckpt PATH` (a trained controller,
    named so by every command), else `other` (an expert, a Udacity driver; `default` when neither is given).
    Both at once is refused."""
    if ckpt is not None and other is not None:
        raise UserError(f"give --ckpt PATH or {other_option} {other}, not both")
    if ckpt is not None:
        if not str(ckpt):
            raise UserError("--ckpt: give the checkpoint's path")
        return f"ckpt:{ckpt}"
    return other if other is not None else default


@dataclass(frozen=True)
class EvalOptions:
    ckpt: Path | None = None
    """a trained controller's checkpoint to drive (the options marked "ckpt:" apply to it)"""
    expert: Annotated[str | None, tyro.conf.arg(help_behavior_hint="(default: ppo, when no --ckpt)")] = None
    """the expert to drive instead: ppo, pursuit or an expert checkpoint's PATH"""
    policy: Annotated[str, tyro.conf.Suppress] = "expert:ppo"
    """the loop's policy spec (expert:NAME|PATH, ckpt:PATH): what `drive eval` makes of --ckpt / --expert with
    `policy_spec`, and what studies set directly"""
    seeds: str = "1000-1019"
    """track seeds: 'A-B' (inclusive), 'A,B,C' or a mix"""
    workers: Workers = 1
    """parallel worker processes, one episode per task; with --ray: episodes in flight"""
    ray: str | None = None
    """run the episodes as Ray tasks: local (a Ray instance here, --workers CPUs), auto (the `ray start` cluster of
    this node) or HOST:PORT"""
    max_episode_steps: PositiveInt = 1000
    """step limit per episode (CarRacing-v3's is 1000)"""
    env: str = "carracing"
    """simulator: carracing, or fake-road (a tiny synthetic road for tests; its expert is 'pursuit')"""
    progress: bool = True
    """show a progress bar"""
    samples: PositiveInt | None = None
    """ckpt: stochastic samples per step (default: the controller's own)"""
    shadow: str | None = None
    """ckpt: shadow expert on the controller's states (default: the expert that labelled its data; none: off)"""
    fallback: str = "off"
    """ckpt: uncertainty-gated fallback (off, expert, slow; MODE:KEY=VALUE,... sets gate fields, e.g.
    expert:blend_steps=0); when on, every seed also runs without it"""
    fallback_threshold: NonNegativeFloat | None = None
    """ckpt: epistemic-variance threshold (default: stored in the checkpoint, else calibrated on --calibrate-seeds)"""
    fallback_twin: Annotated[bool, tyro.conf.Suppress] = True
    """ckpt with a fallback: also drive every seed without it (a study that has driven those episodes already turns
    this off and pairs them itself)"""
    calibrate_seeds: str = "2000-2004"
    """ckpt: nominal laps (no shift, no fallback) that set the failure alarms' thresholds (the "alarm calibration
    laps" bar, after the seeds) and the fallback threshold when none is given or stored"""
    seed: NonNegativeInt = 0
    """ckpt: seed of the controller's sampling"""
    perturb: str = ""
    """ckpt: a distribution shift: camera KIND:LEVEL (noise, blur, occlusion, brightness, motion_blur, fog,
    darkness, jpeg, rain, hue), actuation (steer_delay:N, action_noise:STD), the world (domain_randomize, and the
    CarRacingExtension suite carracing:color, :color3, :bar, :blob, :noise, :video=DIR), your module:function:LEVEL,
    or escalate:KIND:L1,L2,..@SECONDS; the shadow expert still acts on the privileged state"""
    failure_horizon: NonNegativeInt = 25
    """ckpt on carracing: failure prediction, how well each uncertainty signal foresees a failure event (off track,
    spun round, stalled) within this many steps: AUROC, lead time, false alarms per lap (0: off)"""
    envs: NonNegativeInt = 0
    """cars driven at once in each process (lanes): the controller answers all of them in one call per step; an
    episode's record does not depend on it. 0: min(64, seeds per worker), the fastest K of `drive bench closedloop`
    (docs/scale.md)"""
    device: str = "cpu"
    """ckpt: where the controller runs (cpu, cuda, cuda:N, mps); the simulator and the shadow expert stay on the CPU"""


@dataclass(frozen=True)
class DaggerOptions:
    ckpt: Path
    """the clone that drives (a `drive train` checkpoint)"""
    data: Path
    """the demonstrations to aggregate with (their episodes are linked into --out)"""
    out: Path
    """the aggregated dataset directory (new; rerunning the same command resumes it)"""
    seeds: str
    """track seeds of the new episodes (keep them apart from the data's and from evaluation seeds)"""
    expert: str = "pursuit"
    """the expert that labels (ppo, pursuit or an expert checkpoint path)"""
    beta: Probability = 0.3
    """probability per step that the expert's action is executed instead of the clone's"""
    samples: PositiveInt | None = None
    """the clone's stochastic samples per step (default: its own)"""
    workers: Workers = 2
    """parallel worker processes, one episode per task"""
    max_episode_steps: PositiveInt = 1000
    """step limit per episode"""
    seed: NonNegativeInt = 0
    """seed of the mixing coin and the clone's sampling"""
    env: str = "carracing"
    """simulator: carracing, or fake-road (tests; its expert is 'pursuit')"""
    envs: NonNegativeInt = 0
    """cars driven at once in each process, one clone call per step for all; a record does not depend on it. 0:
    min(64, seeds per worker), as `drive eval`"""
    progress: bool = True
    """show a progress bar"""
    query_quantile: OpenUnit | None = None
    """uncertainty-gated DAgger: query the expert only where the clone's steering epistemic variance exceeds this
    quantile of it on nominal laps (None: plain DAgger, every state labelled)"""
    query_threshold: NonNegativeFloat | None = None
    """gated DAgger: the epistemic-variance threshold itself (default: calibrated from query_quantile)"""
    calibrate_seeds: str = "2000-2004"
    """gated DAgger: the clone's nominal laps for the threshold"""


@dataclass(frozen=True)
class SpeedConfig:
    target_speed_mph: PositiveFloat = 20.0
    """cruise speed on a straight with a confident controller (the simulator tops out near 30 mph)"""
    min_speed_mph: NonNegativeFloat = 8.0
    """lowest speed target (tight bends, gated uncertainty)"""
    steer_slowdown: NonNegativeFloat = 0.6
    """target speed falls by this fraction at full steering lock"""
    uncertainty_slowdown: NonNegativeFloat = 2.0
    """target speed falls by this fraction per unit of epistemic std of the steering"""
    gate_std: NonNegativeFloat = 0.0
    """uncertainty gate: above this total predictive std the target drops to min_speed_mph (0 = off)"""
    kp: NonNegativeFloat = 0.1
    """throttle per mph of speed error"""
    kd: NonNegativeFloat = 0.02
    """throttle per mph of speed change since the last frame"""
    max_brake: NonNegativeFloat = 0.5
    """strongest braking, as negative throttle"""


@dataclass(frozen=True)
class BridgeOptions:
    """The bridge's server options, shared by `drive udacity drive` and `drive udacity record`."""

    host: str = "127.0.0.1"
    """address to listen on (the simulator connects to 127.0.0.1)"""
    port: Port = 4567
    """port to listen on (the simulator's is 4567; 0 picks a free one, the URL is printed)"""
    connect_timeout_s: PositiveFloat = 300.0
    """seconds to wait for the simulator to connect and send its first frame"""
    ping_interval_s: PositiveFloat = 25.0
    """engine.io ping interval of the server (the simulator's own is 25 s)"""
    server: Literal["threading", "eventlet"] = DEFAULT_SERVER  # type: ignore[assignment]
    """the bridge's server: threading (werkzeug; `drive bench udacity` measured it faster) or eventlet
    (optional: pip install eventlet==0.41.3)"""
