"""The simulators as registered gymnasium environments, and the driving-env contract every bridge is checked by.

`register()` (idempotent, never run at import) makes `gymnasium.make(ENV_IDS[name], ...)` work for

    drive/CarRacing-v0   sim_bridges.carracing.bridge.CarRacingBridge  kwargs: mode ("pixels" | "state"), fast_render
    drive/FakeRoad-v0    sim_bridges.fake_road.FakeRoad         a tiny synthetic road for tests; kwargs: n_tiles
    drive/Udacity-v0     sim_bridges.udacity.bridge.UdacityEnv         the real simulator over socket.io
    (nondeterministic) drive/CarRacing{Color,Color3,Bar,Blob,Noise,Video}-v0
                         CarRacingBridge(variant=...)           CarRacingExtension's generalisation variants
                                                                (`sim_bridges.carracing.variants`; Video: video_dir=DIR)

`max_episode_steps` is gymnasium's own TimeLimit (defaults 1000, 300). `check_bridge(env)` runs gymnasium's
`check_env` and our contract for the driving envs: action Box(3) (steer, gas, brake) with CarRacing's bounds, the
observation matching its space, and the info keys the closed loop and its observers read.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from sim_bridges.carracing.bridge import ACTION_HIGH, ACTION_LOW, INFO_KEYS
from sim_bridges.carracing.variants import KINDS

ENV_IDS = {"carracing": "drive/CarRacing-v0", "fake-road": "drive/FakeRoad-v0", "udacity": "drive/Udacity-v0"}
_SPECS = {
    "drive/CarRacing-v0": {"entry_point": "sim_bridges.carracing.bridge:CarRacingBridge", "max_episode_steps": 1000},
    "drive/FakeRoad-v0": {"entry_point": "sim_bridges.fake_road:FakeRoad", "max_episode_steps": 300},
    "drive/Udacity-v0": {"entry_point": "sim_bridges.udacity.bridge:UdacityEnv", "nondeterministic": True},
}
VARIANT_IDS = {kind: f"drive/CarRacing{kind.capitalize()}-v0" for kind in KINDS}  # color3 -> CarRacingColor3-v0
_SPECS.update(
    {
        env_id: {
            "entry_point": "sim_bridges.carracing.bridge:CarRacingBridge",
            "max_episode_steps": 1000,
            "kwargs": {"variant": kind},
        }
        for kind, env_id in VARIANT_IDS.items()
    }
)
DRIVING_ENVS = ("carracing", "fake-road")  # the envs with CarRacing's action layout and info (closed-loop BC)


def register() -> None:
    """Register every env id above with gymnasium (idempotent)."""
    for env_id, spec in _SPECS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, **spec)  # type: ignore[arg-type]


def check_bridge(env: gym.Env) -> None:
    """Gymnasium's check_env plus our contract: action layout, observation dtype/shape, info keys on reset/step."""
    from gymnasium.utils.env_checker import check_env

    check_env(env.unwrapped, skip_render_check=True)
    box = env.action_space
    if not (isinstance(box, spaces.Box) and box.shape == (3,) and box.dtype == np.float32):
        raise AssertionError(f"action space must be Box(3,) float32 (steer, gas, brake), got {box}")
    if not (np.array_equal(box.low, ACTION_LOW) and np.array_equal(box.high, ACTION_HIGH)):
        raise AssertionError(f"action bounds must be {ACTION_LOW}..{ACTION_HIGH}, got {box.low}..{box.high}")
    obs, info = env.reset(seed=0)
    step_obs, _, _, _, step_info = env.step(np.array([0.0, 0.5, 0.0], np.float32))
    space = env.observation_space
    for when, o, inf in (("reset", obs, info), ("step", step_obs, step_info)):
        if o.shape != space.shape or o.dtype != space.dtype or not space.contains(o):
            raise AssertionError(f"{when}: observation {o.shape} {o.dtype} does not match {space}")
        missing = [k for k in INFO_KEYS if k not in inf]
        if missing:
            raise AssertionError(f"{when}: info lacks {missing}")
        state = np.asarray(inf["state"])
        if state.ndim != 1 or state.dtype != np.float32 or not np.all(np.isfinite(state)):
            raise AssertionError(f"{when}: info['state'] must be a finite 1-d float32 vector, got {state.shape}")
