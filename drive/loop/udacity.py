"""Driving the Udacity simulator: the policies `drive udacity drive` and `drive udacity record` run.

- `ckpt:PATH` (`SteeringPolicy`): a controller trained on Udacity frames; each frame goes through
  `datasets.udacity.preprocess` (the very function training used), stacked with the previous ones when the
  controller takes several (`datasets.udacity_history.FrameHistory`, reset per connection), and
  `predict(x, samples)`; its mean is the steering and its aleatoric/epistemic variances feed the speed controller;
- `vision` (the simulator's camera) / `vision:carracing` (the CarRacing stand-in's top-down view): the classical
  road follower `agents.experts.road_follower`, from the frame alone.
Speed controller: a PD loop on the speed error towards a target lowered by the steering (|steering| *
steer_slowdown), by the vision policy's bend ahead, and by the epistemic std (epistemic_std * uncertainty_slowdown);
with `gate_std` > 0 the target drops to `min_speed_mph` whenever the total predictive std exceeds it.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import torch

from agents.encoders import input_frames
from agents.experts.road_follower import RoadFollower, RoadFollowerConfig
from datasets.udacity import preprocess
from datasets.udacity_history import FrameHistory
from drive.checkpoint import CheckpointError, load_controller
from drive.errors import UserError
from drive.loop.options import SpeedConfig
from drive.loop.rollout import PolicyOutput, RoadStep, SpeedStep, StepPrediction
from sim_bridges.udacity.transport import SERVERS, TransportError, import_eventlet

log = logging.getLogger(__name__)

VISION_PRESETS = {
    # the simulator's front camera (perspective): tuned on the 1,500 real frames in shared/data (r ~ 0.44)
    "udacity": RoadFollowerConfig(lookahead=12.0, lookahead_per_mph=0.12, k_offset=0.0, near_row=0.82, gain=0.5),
    # the CarRacing stand-in's top-down view: completes laps (the defaults)
    "carracing": RoadFollowerConfig(),
}


class SpeedController:
    """Throttle from the speed error (PD) towards a target lowered by steering, bends and uncertainty."""

    def __init__(self, cfg: SpeedConfig):
        self.cfg = cfg
        self._prev: float | None = None

    def reset(self) -> None:
        self._prev = None

    def __call__(
        self,
        speed_mph: float,
        steering: float,
        slowdown: float = 0.0,
        epistemic_std: float = 0.0,
        total_std: float = 0.0,
    ) -> tuple[float, float, bool]:
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
            raise UserError(f"unknown vision preset {preset!r}; choose one of {sorted(VISION_PRESETS)}")
        self.follower, self.speed = RoadFollower(VISION_PRESETS[preset]), speed

    def reset(self, seed=None) -> None:
        self.follower.reset()
        self.speed.reset()

    def act(self, obs, info) -> PolicyOutput:
        t0 = time.perf_counter()
        v = float(obs["speed"][0])
        steering = self.follower.steer(obs["image"], v)
        last = self.follower.last
        throttle, target, gated = self.speed(v, steering, slowdown=last["slowdown"])
        return PolicyOutput(
            np.array([steering, throttle], np.float32),
            latency_ms=1e3 * (time.perf_counter() - t0),
            speed=SpeedStep(v, target, gated, float(last["slowdown"])),
            road=RoadStep(int(last["road_rows"]), np.asarray(last["line"]), tuple(self.follower.cfg.grid)),  # type: ignore[arg-type]
        )


class SteeringPolicy:
    """A trained controller: preprocess, predict with S samples, steering = mean, uncertainty to the speed loop."""

    def __init__(self, model, samples: int, seed: int, speed: SpeedController):
        self.model, self.samples, self.speed = model, int(samples), speed
        self.generator = torch.Generator().manual_seed(seed)
        self.history = FrameHistory(input_frames(model))  # a multi-frame controller's previous frames

    def reset(self, seed=None) -> None:
        self.speed.reset()
        self.history.reset()

    def predict(self, rgb: np.ndarray) -> StepPrediction:
        x = torch.from_numpy(self.history.push(preprocess(rgb)))[None]  # (1, 3 F, 66, 200) uint8 YUV
        with torch.inference_mode():
            pred = self.model.predict(x, self.samples, self.generator)
        return StepPrediction(pred.mean[0].numpy(), pred.aleatoric_var[0].numpy(), pred.epistemic_var[0].numpy())

    def act(self, obs, info) -> PolicyOutput:
        t0 = time.perf_counter()
        pred = self.predict(obs["image"])
        mean = float(pred.mean[0])
        v = float(obs["speed"][0])
        steering = float(np.clip(mean, -1.0, 1.0)) if math.isfinite(mean) else 0.0
        ale, epi = math.sqrt(max(float(pred.aleatoric_var[0]), 0.0)), math.sqrt(max(float(pred.epistemic_var[0]), 0.0))
        throttle, target, gated = self.speed(v, steering, epistemic_std=epi, total_std=math.hypot(ale, epi))
        return PolicyOutput(
            np.array([steering, throttle], np.float32),
            prediction=pred,
            latency_ms=1e3 * (time.perf_counter() - t0),
            speed=SpeedStep(v, target, gated),
        )


def checked_server(kind: str) -> str:
    """The bridge's server name, refused in one line if unknown or not installed (eventlet is optional)."""
    try:
        if kind == "eventlet":
            import_eventlet()
        elif kind not in SERVERS:
            raise TransportError(f"unknown server {kind!r}; choose one of {', '.join(SERVERS)}")
    except TransportError as exc:
        raise UserError(str(exc)) from None
    return kind


def make_policy(spec: str, speed: SpeedConfig, samples: int = 16, seed: int = 0) -> VisionPolicy | SteeringPolicy:
    """`ckpt:PATH` (a controller trained on Udacity frames), `vision` or `vision:carracing`."""
    control = SpeedController(speed)
    if spec.startswith("ckpt:"):
        path = spec[5:]
        model, payload = load_controller(path)
        encoder, out_dim = payload["config"].get("encoder", {}), payload["config"].get("out_dim")
        if encoder.get("kind") != "nvidia" or out_dim != 1:
            raise CheckpointError(
                f"{path}: a controller for {encoder.get('kind')!r} input with {out_dim} output(s) (task "
                f"{payload.get('data', {}).get('task')!r}); the Udacity bridge needs one trained on Udacity frames "
                "(encoder 'nvidia', steering only: drive train --data udacity:DIR)"
            )
        log.info("controller %s from %s", payload["name"], path)
        return SteeringPolicy(model, samples, seed, control)
    if spec == "vision" or spec.startswith("vision:"):
        return VisionPolicy(spec.partition(":")[2] or "udacity", control)
    raise UserError(f"--driver must be vision or vision:carracing (or give --ckpt PATH), got {spec!r}")
