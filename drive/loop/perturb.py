"""The controller's camera, perturbed: a gymnasium wrapper for the closed loop and a replay of recorded episodes.

`PerturbedCamera(env, perturbation)` perturbs every raw frame the env returns with `datasets.perturb` before any
controller codes it (the privileged state in `info`, which experts and the shadow expert act on, is untouched).
`domain_randomize` changes the world instead of the frame: after `reset` builds the seed's track, the road,
background and grass colours are redrawn as CarRacing's own `domain_randomize` draws them and the first frame is
rendered again — the track stays the one the seed names (stock `domain_randomize=True` draws its colours from the
track RNG first, which would give another track for the same seed).

`replay_frames(actions, seed, perturbation)` drives a fresh env with an episode's recorded executed actions: CarRacing
is deterministic, so the replay visits the recorded states exactly (`drive ood` checks that the clean replay codes
to the recorded frames) and, wrapped, yields the frames the controller would have seen under the perturbation.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from datasets.perturb import FramePerturber, Perturbation
from drive.loop.envs import make_env


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

    def __init__(self, env: gym.Env, perturbation: Perturbation, seed: int = 0):
        super().__init__(env)
        self.perturbation = perturbation
        self.perturber = FramePerturber(perturbation, seed)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self.perturber.reset(seed)
        if self.perturbation.kind == "domain_randomize":
            assert self.perturber.colours is not None
            obs = recolour(self.env.unwrapped, self.perturber.colours)
        return self.perturber(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self.perturber(obs), reward, terminated, truncated, info


def perturbed_env(env: gym.Env, perturbation: Perturbation | None, seed: int = 0) -> gym.Env:
    return env if perturbation is None else PerturbedCamera(env, perturbation, seed)


def replay_frames(actions: np.ndarray, seed: int, perturbation: Perturbation | None = None,
                  max_episode_steps: int = 1000, perturb_seed: int = 0) -> np.ndarray:  # fmt: skip
    """(T, 96, 96, 3): the raw frame seen at each of the T steps of the episode on track `seed` that executed
    `actions` (T, 3), under `perturbation` (None: the clean frames)."""
    env = perturbed_env(make_env("carracing", pixels=True, max_episode_steps=max_episode_steps), perturbation,
                        perturb_seed)  # fmt: skip
    try:
        obs, _ = env.reset(seed=int(seed))
        frames = [obs]
        for action in np.asarray(actions, np.float32)[:-1]:
            obs, _, terminated, truncated, _ = env.step(action)
            frames.append(obs)
            if terminated or truncated:
                break
    finally:
        env.close()
    return np.stack(frames)
