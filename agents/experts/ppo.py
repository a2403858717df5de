"""The PPO expert's deterministic action path, rebuilt as a plain torch module (no stable-baselines3 at inference).

Trained by `drive expert train` with SB3's PPO (Schulman et al. 2017, "Proximal Policy Optimization Algorithms")
on the privileged state vector of `sim_bridges.carracing.bridge`. What is exported is exactly what SB3's
`model.predict(obs, deterministic=True)` computes, plus the observation normalisation and action post-processing:

    z      = clip((state - obs_mean) / sqrt(obs_var + eps), -clip_obs, clip_obs)   VecNormalize, frozen
    a      = clip(W_out . mlp(z) + b_out, -1, 1)                                    Gaussian mean, SB3's Box clip
    action = to_env_action(a, speed)                                               (steer, pedal) -> 3-vector

`to_env_action` is the policy's action parametrisation, used by training too so the two can never disagree (on
tensors there; `PPOExpert`, which acts without torch, runs a numba copy held to its numpy bits by a test).
One pedal axis instead of separate gas and brake (pressing both is never useful and doubles the exploration noise):
- 'accel': gas when positive, brake (times `brake_scale`) when negative.
- 'speed': the axis is a target speed in [v_min, v_max] that a proportional servo tracks with gas or brake.
  Why: with 'accel', deterministic policies learnt a fixed point -- at rest after a spin, facing backwards, the
  mean pedal is "brake" and the car parks for the rest of the episode (seen on ~5% of unseen tracks); the
  stochastic policy never sticks there because its noise presses the gas. With v_min > 0 no output parks the car.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TypeVar

import numpy as np
import torch
from numba import njit
from torch import Tensor, nn

POLICY_ACTION_DIM = 2  # (steer, accel) in [-1, 1]
Array = TypeVar("Array", Tensor, np.ndarray)


@dataclass(frozen=True)
class PPOPolicyConfig:
    obs_dim: int
    """Length of the privileged state vector the policy reads."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the policy MLP."""
    activation: str = "tanh"
    """Hidden activation: tanh or relu."""
    brake_scale: float = 0.8
    """Brake = brake_scale * max(-accel, 0); below 0.9 the stock car's wheels never lock."""
    action_mode: str = "accel"
    """How the second policy output drives the pedals: 'accel' (gas if > 0, brake if < 0) or 'speed' (a target
    speed between v_min and v_max tracked by a proportional gas/brake servo)."""
    speed_index: int = 0
    """Index of the speed (m/s) in the state vector (used by action_mode 'speed')."""
    v_min: float = 5.0
    """'speed' mode: target speed at output -1 (m/s). Above zero, so the car can never park itself for good."""
    v_max: float = 110.0
    """'speed' mode: target speed at output +1 (m/s)."""
    k_gas: float = 0.1
    """'speed' mode: gas per m/s below the target."""
    k_brake: float = 0.06
    """'speed' mode: brake per m/s above the target (capped at brake_scale)."""
    clip_obs: float = 10.0
    """VecNormalize's clip of the standardised observation."""
    obs_eps: float = 1e-8
    """VecNormalize's epsilon under the square root."""

    def to_dict(self) -> dict:
        return {**asdict(self), "hidden": list(self.hidden)}

    @classmethod
    def from_dict(cls, data: dict) -> PPOPolicyConfig:
        return cls(**{**data, "hidden": tuple(data["hidden"])})


def to_env_action(a: Array, speed: Array, cfg: PPOPolicyConfig) -> Array:
    """(B, 2) policy action (steer, pedal) and (B,) speed in m/s -> (B, 3) env action (steer, gas, brake).
    Torch tensors (training) or float32 numpy arrays: the same float32 operations, the same bits. `PPOExpert` acts
    through `_env_actions`, a kernel copy of these operations held to this function's numpy bits by
    tests/agents/test_experts.py: change one, change both."""
    a = a.clip(-1.0, 1.0)
    steer, u = a[:, 0], a[:, 1]
    if cfg.action_mode == "accel":
        gas, brake = u.clip(min=0.0), cfg.brake_scale * (-u).clip(min=0.0)
    elif cfg.action_mode == "speed":
        target = cfg.v_min + 0.5 * (u + 1.0) * (cfg.v_max - cfg.v_min)  # (B,)
        gas = (cfg.k_gas * (target - speed)).clip(0.0, 1.0)
        brake = (cfg.k_brake * (speed - target)).clip(0.0, cfg.brake_scale)
    else:
        raise ValueError(f"action_mode must be 'accel' or 'speed', got {cfg.action_mode!r}")
    if isinstance(a, Tensor):
        return torch.stack([steer, gas, brake], dim=-1)  # type: ignore[list-item]
    return np.stack([steer, gas, brake], axis=-1)


_ACT = {"tanh": nn.Tanh, "relu": nn.ReLU}


class PPOPolicy(nn.Module):
    """Frozen VecNormalize statistics + SB3's policy MLP and action head; forward gives the env action."""

    def __init__(self, cfg: PPOPolicyConfig):
        super().__init__()
        if cfg.action_mode not in ("accel", "speed"):
            raise ValueError(f"action_mode must be 'accel' or 'speed', got {cfg.action_mode!r}")
        if cfg.activation not in _ACT:
            raise ValueError(f"activation must be one of {sorted(_ACT)}, got {cfg.activation!r}")
        self.cfg = cfg
        self.register_buffer("obs_mean", torch.zeros(cfg.obs_dim))
        self.register_buffer("obs_var", torch.ones(cfg.obs_dim))
        layers: list[nn.Module] = []
        width = cfg.obs_dim
        for h in cfg.hidden:
            layers += [nn.Linear(width, h), _ACT[cfg.activation]()]
            width = h
        self.policy_net = nn.Sequential(*layers)  # same layout as SB3's mlp_extractor.policy_net
        self.action_net = nn.Linear(width, POLICY_ACTION_DIM)

    def policy_action(self, state: Tensor) -> Tensor:
        """(B, obs_dim) raw state -> (B, 2) clipped policy action (steer, accel)."""
        z = (state - self.obs_mean) / torch.sqrt(self.obs_var + self.cfg.obs_eps)  # (B, obs_dim)
        z = z.clamp(-self.cfg.clip_obs, self.cfg.clip_obs)
        return self.action_net(self.policy_net(z)).clamp(-1.0, 1.0)  # (B, 2)

    def forward(self, state: Tensor) -> Tensor:
        """(B, obs_dim) raw state -> (B, 3) env action (steer, gas, brake)."""
        return to_env_action(self.policy_action(state), state[:, self.cfg.speed_index], self.cfg)


@njit(cache=True, boundscheck=False)
def _dense(x, wt, b, out):  # pragma: no cover - compiled
    """out (K, O) = x (K, I) @ wt (I, O) + b; per row, the sum runs over inputs in order (vectorised over outputs),
    so a row's result never depends on the other rows."""
    for r in range(x.shape[0]):
        acc = out[r]
        acc[:] = 0.0
        for i in range(wt.shape[0]):
            xi, w = x[r, i], wt[i]
            for j in range(wt.shape[1]):
                acc[j] += w[j] * xi
        for j in range(wt.shape[1]):
            acc[j] += b[j]
    return out


# numpy's float clip at a tie with its lower bound: numpy 2 keeps x (np.clip(-0.0, 0.0, 1.0) is -0.0), numpy 1.26
# gives the bound (+0.0). The kernels take it as an argument (not a global, which numba's cache would freeze).
TIE_KEEPS_X = bool(np.signbit(np.array([-0.0], np.float32).clip(0.0, 1.0))[0])


@njit(cache=True, inline="always")
def _clip(x, lo, hi, keep):  # pragma: no cover - compiled
    """numpy's float clip with scalar bounds, bit for bit: NaN passes; at a tie with lo, x if `keep` (TIE_KEEPS_X)."""
    if x != x:
        return x
    y = x if (x > lo or (keep and x == lo)) else lo
    return hi if y > hi else y


@njit(cache=True, boundscheck=False)
def _standardised(states, mean, std, bound, keep, out):  # pragma: no cover - compiled
    """out (K, I) = ((states - mean) / std).clip(-bound, bound) in float32, as numpy computes it."""
    for r in range(states.shape[0]):
        for i in range(states.shape[1]):
            out[r, i] = _clip((states[r, i] - mean[i]) / std[i], -bound, bound, keep)
    return out


@njit(cache=True, boundscheck=False)
def _env_actions(a, speed, speed_mode, keep, c, out):  # pragma: no cover - compiled
    """out (K, 3) = to_env_action(a.clip(-1, 1), speed) on float32 numpy arrays, bit for bit (its float32 operations
    in its order). c: float32 (brake_scale, v_min, v_max - v_min, k_gas, k_brake)."""
    one, zero, half = np.float32(1.0), np.float32(0.0), np.float32(0.5)
    for r in range(a.shape[0]):
        steer, u = _clip(a[r, 0], -one, one, keep), _clip(a[r, 1], -one, one, keep)
        if speed_mode:
            target = c[1] + half * (u + one) * c[2]
            gas = _clip(c[3] * (target - speed[r]), zero, one, keep)
            brake = _clip(c[4] * (speed[r] - target), zero, c[0], keep)
        else:  # np.maximum(u, 0.0): NaN passes, a tie gives the 0.0
            gas, brake = u if (u != u or u > zero) else zero, c[0] * (-u if (u != u or -u > zero) else zero)
        out[r, 0], out[r, 1], out[r, 2] = steer, gas, brake
    return out


@njit(cache=True, boundscheck=False)
def _input_layer(states, mean, std, bound, keep, z, wt, b, out):  # pragma: no cover - compiled
    """The first layer on the standardised states: `_standardised` into z, then `_dense` into out, in one call."""
    return _dense(_standardised(states, mean, std, bound, keep, z), wt, b, out)


@njit(cache=True, boundscheck=False)
def _output_layer(x, wt, b, a, states, speed_index, speed_mode, keep, c, out):  # pragma: no cover - compiled
    """The last layer into a, then `_env_actions` on it and the states' speed column into out, in one call."""
    return _env_actions(_dense(x, wt, b, a), states[:, speed_index], speed_mode, keep, c, out)


def _tanh(x: np.ndarray) -> np.ndarray:
    return np.tanh(x, out=x)


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0, out=x)


_ACTIVATION_FN = {"tanh": _tanh, "relu": _relu}


class PPOExpert:
    """Expert interface: `reset()`, `act(state) -> (3,) float32`. Stateless: the policy is a function of the state.

    Acting runs the policy's forward (its weights as of construction) in float32 numba kernels, not through torch:
    the standardisation, each layer and the action mapping, each numpy's operations in numpy's order (bit for bit:
    tests/agents/test_experts.py), with numpy's tanh between them. Why: the closed loop asks for one action per
    car-step between two frames, and torch's dispatch of eight small ops ran in caches the renderer had just evicted
    (with the faster frame coding, this took `drive bench closedloop`'s collect row from 867 to 1023 steps per CPU-s:
    docs/scale.md); numpy's dozen small calls after it cost ~24 us per call, the kernels ~10 (docs/scale.md). The first
    layer runs with the standardisation and the last with the action mapping, one call each (a numba call from Python
    costs its argument checks: `drive bench closedloop` prints the expert's share of a collect step). Each
    row is computed alone, so K cars' states in one `act_many` call (drive/loop/lanes.py) get what each gets alone,
    bit for bit. Departure from `PPOPolicy.forward`, which is what SB3 computes: the matrix products sum in another
    order and tanh is numpy's, so actions differ in the last bits (below 1e-5: tests/agents/test_experts.py), and
    closed-loop laps with them (checkpoints/expert_ppo.md has the returns before and after).
    """

    def __init__(self, policy: PPOPolicy):
        self.policy = policy.eval()
        cfg = policy.cfg
        linears = [m for m in policy.policy_net if isinstance(m, nn.Linear)] + [policy.action_net]
        self._layers = [
            (
                np.ascontiguousarray(m.weight.detach().cpu().numpy().T, np.float32),
                m.bias.detach().cpu().numpy().astype(np.float32),
            )
            for m in linears
        ]
        self._mean = policy.obs_mean.detach().cpu().numpy().astype(np.float32)  # type: ignore[operator]
        self._std = np.sqrt(policy.obs_var.detach().cpu().numpy().astype(np.float32) + cfg.obs_eps)  # type: ignore[operator]
        self._activation = _ACTIVATION_FN[cfg.activation]  # elementwise, numpy's float32 kernels
        if cfg.action_mode not in ("accel", "speed"):
            raise ValueError(f"action_mode must be 'accel' or 'speed', got {cfg.action_mode!r}")
        # the Python floats of to_env_action as numpy casts them next to float32 arrays
        self._consts = np.array([cfg.brake_scale, cfg.v_min, cfg.v_max - cfg.v_min, cfg.k_gas, cfg.k_brake], np.float32)

    def reset(self) -> None:
        pass

    @property
    def lane_key(self) -> tuple[str, int]:
        """Experts with equal keys answer in one `act_many` call (drive/loop/lanes.py `expert_lanes`): one policy."""
        return ("ppo", id(self.policy))

    def act(self, state: np.ndarray) -> np.ndarray:
        return self.act_many(np.asarray(state, dtype=np.float32)[None])[0]

    def act_many(self, states: np.ndarray) -> np.ndarray:
        """(K, obs_dim) states -> (K, 3) float32 env actions, each row what that state gets alone."""
        cfg = self.policy.cfg
        states = np.asarray(states, dtype=np.float32)
        if states.ndim != 2 or states.shape[1] != cfg.obs_dim:
            raise ValueError(f"PPO expert expects a state of shape ({cfg.obs_dim},), got {states.shape[1:]}")
        k, bound, z = len(states), np.float32(cfg.clip_obs), np.empty_like(states)
        if len(self._layers) == 1:
            x = _standardised(states, self._mean, self._std, bound, TIE_KEEPS_X, z)  # (K, I)
        else:  # three kernel calls for two hidden layers: each call from Python pays its argument checks
            wt, b = self._layers[0]
            x = _input_layer(
                states, self._mean, self._std, bound, TIE_KEEPS_X, z, wt, b, np.empty((k, wt.shape[1]), np.float32)
            )
            for wt, b in self._layers[1:-1]:
                x = _dense(self._activation(x), wt, b, np.empty((k, wt.shape[1]), np.float32))  # (K, width)
            x = self._activation(x)
        wt, b = self._layers[-1]
        a, out = np.empty((k, wt.shape[1]), np.float32), np.empty((k, 3), np.float32)
        return _output_layer(
            x, wt, b, a, states, cfg.speed_index, cfg.action_mode == "speed", TIE_KEEPS_X, self._consts, out
        )
