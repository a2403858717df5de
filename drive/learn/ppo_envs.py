"""The PPO expert's training envs: the (steer, pedal) action of agents.experts.ppo, and training-only shaping
(episodes ended off track, a per-wheel penalty, random starts) that evaluation never sees."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.monitor import Monitor

from agents.experts.ppo import PPOPolicyConfig, to_env_action
from sim_bridges.carracing.bridge import IDX, TRACK_HALF_WIDTH, make_carracing


class PolicyAction(gym.Wrapper):
    """Expose the (steer, pedal) parametrisation of agents.experts.ppo to the learner (needs the current speed)."""

    def __init__(self, env, pcfg):
        super().__init__(env)
        self.pcfg, self.speed = pcfg, 0.0
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.speed = info["speed"]
        return obs, info

    def step(self, action):
        a = torch.as_tensor(np.asarray(action, np.float32).reshape(1, 2))
        env_action = to_env_action(a, torch.tensor([self.speed]), self.pcfg)[0].numpy()
        obs, reward, terminated, truncated, info = self.env.step(env_action)
        self.speed = info["speed"]
        return obs, reward, terminated, truncated, info


class TrainShaping(gym.Wrapper):
    """Training only: end the episode after `patience` consecutive off-track steps, with a penalty, and charge
    `wheel_penalty` per wheel off the road each step; with probability `perturb_prob` start the episode from a
    random track point with any heading and a lateral offset within the road. Evaluation never sees this wrapper."""

    def __init__(self, env, patience: int, penalty: float, wheel_penalty: float = 0.0, perturb_prob: float = 0.25):
        super().__init__(env)
        self.patience, self.penalty, self.wheel_penalty, self.count = patience, penalty, wheel_penalty, 0
        self.perturb_prob = perturb_prob
        self.wheels = slice(IDX["road_fl"], IDX["road_rr"] + 1)

    def reset(self, **kwargs):
        self.count = 0
        obs, info = self.env.reset(**kwargs)
        base = self.env.unwrapped
        rng = base.np_random
        if self.perturb_prob and rng.random() < self.perturb_prob:
            _, beta, x, y = base.track[int(rng.integers(len(base.track)))]
            shift = rng.uniform(-0.8, 0.8) * TRACK_HALF_WIDTH  # (cos beta, sin beta) points right of travel
            heading = beta + np.pi / 2 + rng.uniform(-np.pi, np.pi)
            obs, info = base.place_car(x + shift * np.cos(beta), y + shift * np.sin(beta), heading)
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.count = self.count + 1 if info["off_track"] else 0
        if self.wheel_penalty:
            reward -= self.wheel_penalty * float(4.0 - info["state"][self.wheels].sum())
        if self.patience and self.count >= self.patience and not (terminated or truncated):
            terminated, reward = True, reward - self.penalty
        return obs, reward, terminated, truncated, info


def make_env(cfg: Any, rank: int, pcfg: PPOPolicyConfig):
    """The env factory of training worker `rank` (cfg: drive.learn.ppo_expert.PPOExpertOptions)."""

    def thunk():
        torch.set_num_threads(1)
        env = make_carracing(mode="state")
        env = TrainShaping(env, cfg.offtrack_patience, cfg.offtrack_penalty, cfg.wheel_off_penalty, cfg.perturb_prob)
        env = Monitor(PolicyAction(env, pcfg))
        env.reset(seed=cfg.seed * 1000 + rank)
        return env

    return thunk
