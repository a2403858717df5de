"""The envs a command drives, by name, through gymnasium's registry (`sim_bridges.registry`).

`make_env("carracing", pixels=False)` is CarRacing's state-only mode (experts act from the privileged state; no
frame is drawn, same physics and reward); `pixels=True` gives the (96, 96, 3) frame controllers are coded from.
"""

from __future__ import annotations

import gymnasium as gym

from drive.errors import UserError
from sim_bridges import registry

ENVS = registry.DRIVING_ENVS


def make_env(
    name: str = "carracing", *, pixels: bool = True, max_episode_steps: int = 1000, fast_render: bool = True
) -> gym.Env:
    """A driving env by name (carracing, fake-road) via gymnasium.make, wrapped in TimeLimit(max_episode_steps)."""
    if name not in ENVS:
        raise UserError(f"unknown env {name!r}; choose one of {ENVS}")
    registry.register()
    kwargs = {"mode": "pixels" if pixels else "state", "fast_render": fast_render} if name == "carracing" else {}
    return gym.make(registry.ENV_IDS[name], max_episode_steps=max_episode_steps, disable_env_checker=True, **kwargs)
