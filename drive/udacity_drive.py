"""`drive udacity drive`: drive the Udacity simulator (or its stand-in) over socket.io with a policy.

Start the simulator, choose Autonomous Mode; it connects to ws://HOST:PORT. Policies:
- `ckpt:PATH`: a trained controller (`drive.checkpoint.load_controller`); each frame goes through
  `datasets.udacity.preprocess` (the very function training used) and `predict(x, n_samples)`; its mean is the
  steering and its aleatoric/epistemic variances feed the speed controller;
- `vision` (the simulator's camera) / `vision:carracing` (the CarRacing stand-in's top-down view): the classical
  road follower `agents.experts.road_follower`, from the frame alone.
Speed controller: a PD loop on the speed error towards a target lowered by the steering (|steering| *
steer_slowdown), by the vision policy's bend ahead, and by the epistemic std (epistemic_std * uncertainty_slowdown);
with `gate_std` > 0 the target drops to `min_speed_mph` whenever the total predictive std exceeds it.
Every step is logged (steps.csv flushed per row, steps.parquet at the end), the overlay is shown (or written to
overlay.mp4 when headless), the session's counters (answers, refused frames by reason) land in session.json.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from agents.experts.road_follower import RoadFollower, RoadFollowerConfig

log = logging.getLogger(__name__)

VISION_PRESETS = {
    # the simulator's front camera (perspective): tuned on the 1,500 real frames in shared/data (r ~ 0.44)
    "udacity": RoadFollowerConfig(lookahead=12.0, lookahead_per_mph=0.12, k_offset=0.0, near_row=0.82, gain=0.5),
    # the CarRacing stand-in's top-down view: completes laps (the defaults)
    "carracing": RoadFollowerConfig(),
}


@dataclass(frozen=True)
class Config:
    policy: str = "vision"
    """ckpt:PATH (a trained controller), vision (road follower, simulator camera), vision:carracing (stand-in)"""
    host: str = "127.0.0.1"
    """address to listen on (the simulator connects to 127.0.0.1)"""
    port: int = 4567
    """port to listen on (the simulator's is 4567; 0 picks a free one)"""
    target_speed_mph: float = 20.0
    """cruise speed on a straight with a confident controller (the simulator tops out near 30 mph)"""
    min_speed_mph: float = 8.0
    """lowest speed target (tight bends, gated uncertainty)"""
    steer_slowdown: float = 0.6
    """target speed falls by this fraction at full steering lock"""
    uncertainty_slowdown: float = 2.0
    """target speed falls by this fraction per unit of epistemic std of the steering"""
    gate_std: float = 0.0
    """uncertainty gate: above this total predictive std the target drops to min_speed_mph (0 = off)"""
    kp: float = 0.1
    """throttle per mph of speed error"""
    kd: float = 0.02
    """throttle per mph of speed change since the last frame"""
    max_brake: float = 0.5
    """strongest braking, as negative throttle"""
    n_samples: int = 16
    """stochastic samples per prediction (S) for ckpt policies"""
    episodes: int = 1
    """episodes to drive; an episode ends after max_steps or when no frame comes for timeout_s"""
    max_steps: int = 0
    """steps per episode (0 = until the simulator stops sending)"""
    timeout_s: float = 5.0
    """seconds to wait for the next frame before ending the episode"""
    connect_timeout_s: float = 300.0
    """seconds to wait for the simulator to connect and send its first frame"""
    ping_interval_s: float = 25.0
    """engine.io ping interval of the server (the simulator's own is 25 s)"""
    display: Literal["auto", "window", "video", "none"] = "auto"
    """overlay: a window, an mp4 in the run directory, or none (auto: window when a display exists)"""
    run_dir: str = ""
    """where logs go (default runs/udacity_drive/<timestamp>)"""
    seed: int = 0
    """seed of the controller's sampling generator"""
    threads: int = 1
    """torch CPU threads"""


class SpeedController:
    """Throttle from the speed error (PD) towards a target lowered by steering, bends and uncertainty."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self._prev: float | None = None

    def reset(self) -> None:
        self._prev = None

    def __call__(self, speed_mph: float, steering: float, slowdown: float = 0.0, epistemic_std: float = 0.0,
                 total_std: float = 0.0) -> tuple[float, float, bool]:  # fmt: skip
        c = self.cfg
        factor = (1 - c.steer_slowdown * min(abs(steering), 1.0)) * (1 - min(max(slowdown, 0.0), 1.0))
        factor *= max(0.0, 1 - c.uncertainty_slowdown * epistemic_std)
        gated = c.gate_std > 0 and total_std > c.gate_std
        target = c.min_speed_mph if gated else max(c.min_speed_mph, c.target_speed_mph * factor)
        accel = 0.0 if self._prev is None else speed_mph - self._prev
        self._prev = speed_mph
        throttle = float(np.clip(c.kp * (target - speed_mph) - c.kd * accel, -c.max_brake, 1.0))
        return throttle, target, gated


class VisionPolicy:
    def __init__(self, preset: str, speed: SpeedController):
        if preset not in VISION_PRESETS:
            raise ValueError(f"unknown vision preset {preset!r}; choose one of {sorted(VISION_PRESETS)}")
        self.follower, self.speed = RoadFollower(VISION_PRESETS[preset]), speed

    def reset(self, seed=None) -> None:
        self.follower.reset()
        self.speed.reset()

    def act(self, obs, info):
        from drive.rollout import PolicyOutput

        t0 = time.perf_counter()
        v = float(obs["speed"][0])
        steering = self.follower.steer(obs["image"], v)
        last = self.follower.last
        throttle, target, gated = self.speed(v, steering, slowdown=last["slowdown"])
        extras = {"latency_ms": 1e3 * (time.perf_counter() - t0), "speed_mph": v, "target_mph": target,
                  "gated": gated, "mean": steering, "slowdown": last["slowdown"], "road_rows": last["road_rows"],
                  "line": last["line"], "grid": self.follower.cfg.grid}  # fmt: skip
        return PolicyOutput(np.array([steering, throttle], np.float32), extras=extras)


class ControllerPolicy:
    """A trained controller: preprocess, predict with S samples, steering = mean, uncertainty to the speed loop."""

    def __init__(self, model, n_samples: int, seed: int, speed: SpeedController):
        import torch

        self.model, self.n_samples, self.speed = model, int(n_samples), speed
        self.generator = torch.Generator().manual_seed(seed)

    def reset(self, seed=None) -> None:
        self.speed.reset()

    def predict(self, rgb: np.ndarray):
        import torch

        from datasets.udacity import preprocess

        x = torch.from_numpy(preprocess(rgb))[None]  # (1, 3, 66, 200) uint8 YUV
        with torch.inference_mode():
            pred = self.model.predict(x, self.n_samples, self.generator)
        return (float(pred.mean[0, 0]), float(pred.aleatoric_var[0, 0]), float(pred.epistemic_var[0, 0]))

    def act(self, obs, info):
        from drive.rollout import PolicyOutput

        t0 = time.perf_counter()
        mean, ale_var, epi_var = self.predict(obs["image"])
        v = float(obs["speed"][0])
        steering = float(np.clip(mean, -1.0, 1.0)) if math.isfinite(mean) else 0.0
        ale, epi = math.sqrt(max(ale_var, 0.0)), math.sqrt(max(epi_var, 0.0))
        throttle, target, gated = self.speed(v, steering, epistemic_std=epi, total_std=math.hypot(ale, epi))
        extras = {"latency_ms": 1e3 * (time.perf_counter() - t0), "speed_mph": v, "target_mph": target,
                  "gated": gated, "mean": mean, "aleatoric_std": ale, "epistemic_std": epi}  # fmt: skip
        return PolicyOutput(np.array([steering, throttle], np.float32), extras=extras)


def make_policy(cfg: Config):
    speed = SpeedController(cfg)
    if cfg.policy.startswith("ckpt:"):
        from drive.checkpoint import load_controller

        model, payload = load_controller(cfg.policy[5:])
        log.info("controller %s from %s", payload["name"], cfg.policy[5:])
        return ControllerPolicy(model, cfg.n_samples, cfg.seed, speed)
    if cfg.policy == "vision" or cfg.policy.startswith("vision:"):
        return VisionPolicy(cfg.policy.partition(":")[2] or "udacity", speed)
    raise ValueError(f"--policy must be ckpt:PATH, vision or vision:carracing, got {cfg.policy!r}")


def run(cfg: Config) -> int:
    import torch
    from gymnasium.wrappers import TimeLimit
    from tqdm import tqdm

    from drive.checkpoint import CheckpointError
    from drive.rollout import rollout
    from drive.udacity_observers import Overlay, StepLog, StopDriving
    from sim_bridges.udacity import UdacityEnv

    tqdm.monitor_interval = 0  # no monitor thread: the loop updates its bar itself
    torch.set_num_threads(cfg.threads)
    try:
        policy = make_policy(cfg)  # a bad checkpoint or policy name fails before we bind a port
    except (CheckpointError, ValueError) as exc:
        print(f"drive udacity drive: {exc}")
        return 2
    run_dir = Path(cfg.run_dir or f"runs/udacity_drive/{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    env = UdacityEnv(cfg.host, cfg.port, timeout_s=cfg.timeout_s, connect_timeout_s=cfg.connect_timeout_s,
                     ping_interval=cfg.ping_interval_s)  # fmt: skip
    print(f"listening on ws://{cfg.host}:{env.server.port}/socket.io/ -- start the simulator in Autonomous Mode")
    print(f"logging to {run_dir}", flush=True)
    steps, bar = StepLog(run_dir), tqdm(desc="frames", unit="frame", mininterval=1.0)
    observers = [steps, lambda rec: bar.update(1)]
    overlay = None if cfg.display == "none" else Overlay(cfg.display, run_dir / "overlay.mp4")
    observers += [overlay] if overlay else []
    wrapped = TimeLimit(env, cfg.max_steps) if cfg.max_steps > 0 else env
    results, code = [], 0
    try:
        results = rollout(wrapped, policy, seeds=range(cfg.seed, cfg.seed + cfg.episodes), on_step=observers)
    except TimeoutError as exc:
        print(f"drive udacity drive: {exc}")
        code = 1
    except (KeyboardInterrupt, StopDriving):
        print("stopped")
    finally:
        bar.close()
        stats = env.server.snapshot()
        env.close()
        steps.close()
        if overlay:
            overlay.close()
    lat = np.array([x for x in steps.latencies_ms if math.isfinite(x)])
    session = {"server": stats, "episodes": [r.to_dict() for r in results], "policy_latency_ms": {}}
    if lat.size:
        session["policy_latency_ms"] = {"p50": float(np.percentile(lat, 50)), "p95": float(np.percentile(lat, 95))}
    (run_dir / "session.json").write_text(json.dumps(session, indent=2))
    print(f"{len(lat)} steps; answers {stats.get('answered.steer', 0)} steer, {stats.get('answered.manual', 0)} "
          f"manual, {stats.get('answered.safe', 0)} safe; refused {stats['refused']}; "
          f"policy p50/p95 {session['policy_latency_ms'].get('p50', math.nan):.1f}/"
          f"{session['policy_latency_ms'].get('p95', math.nan):.1f} ms")  # fmt: skip
    if overlay and overlay.mode == "video" and overlay.n_frames:
        print(f"overlay video: {run_dir / 'overlay.mp4'}")
    return code
