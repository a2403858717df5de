"""Recorded episodes replayed through a perturbed camera: the frames a controller would have seen.

`replay_frames(actions, seed, perturbation)` drives a fresh env with an episode's recorded executed actions: CarRacing
is deterministic, so the replay visits the recorded states exactly (`drive ood` checks that the clean replay codes
to the recorded frames) and, wrapped (drive/perturb/wrappers.py `perturbed_env`), yields the frames the controller
would have seen under the perturbation.
"""

from __future__ import annotations

import numpy as np

from drive.loop.envs import make_env
from drive.perturb.camera import Perturbation
from drive.perturb.wrappers import perturbed_env


def replay_frames(
    actions: np.ndarray,
    seed: int,
    perturbation: Perturbation | None = None,
    max_episode_steps: int = 1000,
    perturb_seed: int = 0,
) -> np.ndarray:
    """(T, 96, 96, 3): the raw frame seen at each of the T steps of the episode on track `seed` that executed
    `actions` (T, 3), under `perturbation` (None: the clean frames)."""
    env = perturbed_env(
        make_env("carracing", pixels=True, max_episode_steps=max_episode_steps), perturbation, perturb_seed
    )
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
