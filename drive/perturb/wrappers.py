"""The controller's camera and actuators, perturbed: gymnasium wrappers for the closed loop and a replay of recorded
episodes. drive/perturb/registry.py names them in one grammar (`parse_shift`, `shifted_env`).

`PerturbedCamera(env, perturbation)` perturbs every raw frame the env returns with `drive.perturb.camera` (or any
perturber: `reset(episode_seed)`, `__call__(frame) -> frame`) before any controller codes it (the privileged state
in `info`, which experts and the shadow expert act on, is untouched).
`domain_randomize` changes the world instead of the frame: after `reset` builds the seed's track, the road,
background and grass colours are redrawn as CarRacing's own `domain_randomize` draws them and the first frame is
rendered again — the track stays the one the seed names (stock `domain_randomize=True` draws its colours from the
track RNG first, which would give another track for the same seed).

`ShiftedActuation(env, kind, seed)` changes what the car does, not what it sees: `steer_delay` (level N, an integer
number of steps) executes the steering commanded N steps earlier (0 for the first N steps of an episode) with this
step's gas and brake; `action_noise` (level: a std in action units, [0, 2]) adds Gaussian noise to all three
executed actions, clipped to the action space, drawn from an RNG seeded per episode from (seed, track seed). Its
`level` may change mid-episode (escalation); None is the clean actuator. The executed action goes to
`info["executed_action"]`; the privileged state the experts read is the simulator's own, untouched.

`perturbed_env(env, perturbation)` wraps an env's camera (None: the env itself); drive/studies/ood/replay.py replays
recorded episodes through it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from drive.perturb.camera import FramePerturber, Perturbation

ACTUATION_KINDS = {
    "steer_delay": "steering delay in steps (50 per second), integer in [0, 250]",
    "action_noise": "Gaussian noise std on every executed action, in action units, [0, 2]",
}
STEER = 0  # CarRacing's action layout: steer, gas, brake


def recolour(env: Any, colours: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """Give a reset CarRacing (unwrapped, pixel mode) new road / background / grass colours; returns the frame now.

    Each road tile keeps its stock shading offset (0, 2.55 or 5.1 on every channel); kerbs keep their colours."""
    road, background, grass = (np.asarray(c, dtype=np.float64) for c in colours)
    old = np.asarray(env.road_color, dtype=np.float64)
    for tile in env.road:  # tile.color is the array road_poly holds for that tile
        tile.color[:] = road + (np.asarray(tile.color, dtype=np.float64) - old)
    env.road_color, env.bg_color, env.grass_color = road, background, grass
    env.state = env._render("state_pixels")
    return np.array(env.state, dtype=np.uint8)


class PerturbedCamera(gym.Wrapper):
    """Perturbs the raw frames of a pixel CarRacing env (see the module docstring); seeded per episode."""

    def __init__(self, env: gym.Env, perturbation: Perturbation | Any, seed: int = 0):
        super().__init__(env)
        self.perturbation = perturbation
        self.perturber = FramePerturber(perturbation, seed) if isinstance(perturbation, Perturbation) else perturbation

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self.perturber.reset(seed)
        colours = getattr(self.perturber, "colours", None)  # domain_randomize: the world, not the frame
        if colours is not None:
            obs = recolour(self.env.unwrapped, colours)
        return self.perturber(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self.perturber(obs), reward, terminated, truncated, info


class ShiftedActuation(gym.Wrapper):
    """The executed action under `steer_delay` or `action_noise` at `level` (see the module docstring)."""

    def __init__(self, env: gym.Env, kind: str, level: float | None, seed: int = 0):
        super().__init__(env)
        if kind not in ACTUATION_KINDS:
            raise ValueError(f"actuation shift {kind!r}: choose one of {sorted(ACTUATION_KINDS)}")
        self.kind, self.level, self.seed = kind, level, int(seed)
        self.low, self.high = env.action_space.low, env.action_space.high  # type: ignore[attr-defined]
        self.reset_stream(None)

    def reset_stream(self, episode_seed: int | None) -> None:
        self.rng = np.random.default_rng([self.seed, 0 if episode_seed is None else int(episode_seed)])
        self.steer: list[float] = []  # every commanded steering of the episode: a delay may grow mid-episode

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.reset_stream(seed)
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        commanded = np.asarray(action, np.float32)
        executed = commanded.copy()
        if self.kind == "steer_delay":
            self.steer.append(float(commanded[STEER]))
            delay = int(self.level or 0)
            t = len(self.steer) - 1
            executed[STEER] = self.steer[t - delay] if t >= delay else 0.0
        else:  # drawn every step, clean or not: the stream of an episode never depends on its schedule
            noise = self.rng.standard_normal(commanded.shape).astype(np.float32)
            noisy = commanded + np.float32(self.level or 0.0) * noise
            executed = np.minimum(np.maximum(noisy, self.low), self.high)  # rollout's clip_action, same bits
        obs, reward, terminated, truncated, info = self.env.step(executed)
        return obs, reward, terminated, truncated, {**info, "executed_action": executed}


def perturbed_env(env: gym.Env, perturbation: Perturbation | None, seed: int = 0) -> gym.Env:
    return env if perturbation is None else PerturbedCamera(env, perturbation, seed)
