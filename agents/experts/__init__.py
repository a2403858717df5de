"""Experts that drive CarRacing from the privileged state vector (`info["state"]` of sim_bridges.carracing.bridge).

Each exposes `reset()` and `act(state) -> (3,) float32` (steer, gas, brake):
- `pursuit.PurePursuit`: geometric pure pursuit with a curvature speed governor, no learning.
- `ppo.PPOExpert`: the PPO policy's deterministic action path, rebuilt from our checkpoint without SB3.

They learn the state layout from a config (names of the entries), never by importing `sim_bridges`.
"""
