"""Every registered driving env is made by gymnasium.make and passes one contract (sim_bridges.registry)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from drive.loop.envs import make_env
from sim_bridges import registry


@pytest.mark.parametrize("name", registry.DRIVING_ENVS)
def test_registered_driving_envs_pass_the_contract(name):
    registry.register()
    env = gym.make(registry.ENV_IDS[name], max_episode_steps=20)
    registry.check_bridge(env)
    assert env.spec is not None and env.spec.id == registry.ENV_IDS[name]
    env.close()


def test_registration_is_idempotent_and_never_at_import():
    registry.register()
    registry.register()
    assert all(env_id in gym.registry for env_id in registry.ENV_IDS.values())
    assert gym.registry[registry.ENV_IDS["udacity"]].nondeterministic


@pytest.mark.parametrize("name", registry.DRIVING_ENVS)
def test_make_env_pixels_and_time_limit(name):
    env = make_env(name, max_episode_steps=5)
    obs, info = env.reset(seed=3)
    assert obs.shape == (96, 96, 3) and obs.dtype == np.uint8 and "state" in info
    steps = 0
    while True:
        *_, terminated, truncated, _ = env.step(np.array([0.0, 0.3, 0.0], np.float32))
        steps += 1
        if terminated or truncated:
            break
    assert steps <= 5
    env.close()


def test_carracing_state_mode_by_name():
    env = make_env("carracing", pixels=False, max_episode_steps=3)
    obs, info = env.reset(seed=0)
    np.testing.assert_array_equal(obs, info["state"])
    env.close()


def test_unknown_env_is_a_user_error():
    from drive.errors import UserError

    with pytest.raises(UserError, match="unknown env"):
        make_env("mars")
