"""The PPO expert's deterministic action path, rebuilt as a plain torch module (no stable-baselines3 at inference).

Trained by `drive expert train` with SB3's PPO (Schulman et al. 2017, "Proximal Policy Optimization Algorithms")
on the privileged state vector of `sim_bridges.carracing`. What is exported is exactly what SB3's
`model.predict(obs, deterministic=True)` computes, plus the observation normalisation and action post-processing:

    z      = clip((state - obs_mean) / sqrt(obs_var + eps), -clip_obs, clip_obs)   VecNormalize, frozen
    a      = clip(W_out . mlp(z) + b_out, -1, 1)                                    Gaussian mean, SB3's Box clip
    action = to_env_action(a)          (steer, accel) -> (steer, gas, brake); PPOPolicy.forward is its torch twin

`to_env_action` is the policy's action parametrisation, shared with training so the two can never disagree:
a single accelerator axis (gas when positive, brake when negative, scaled by `brake_scale`) instead of separate
gas and brake, because pressing both is never useful and doubles the exploration noise on the pedals.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor, nn

POLICY_ACTION_DIM = 2  # (steer, accel) in [-1, 1]


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
    clip_obs: float = 10.0
    """VecNormalize's clip of the standardised observation."""
    obs_eps: float = 1e-8
    """VecNormalize's epsilon under the square root."""

    def to_dict(self) -> dict:
        return {**asdict(self), "hidden": list(self.hidden)}

    @classmethod
    def from_dict(cls, data: dict) -> PPOPolicyConfig:
        return cls(**{**data, "hidden": tuple(data["hidden"])})


def to_env_action(a: np.ndarray, brake_scale: float) -> np.ndarray:
    """(..., 2) policy action -> (..., 3) float32 env action (steer, gas, brake)."""
    a = np.clip(np.asarray(a, dtype=np.float32), -1.0, 1.0)
    steer, accel = a[..., 0], a[..., 1]
    return np.stack([steer, np.maximum(accel, 0.0), brake_scale * np.maximum(-accel, 0.0)], axis=-1).astype(np.float32)


_ACT = {"tanh": nn.Tanh, "relu": nn.ReLU}


class PPOPolicy(nn.Module):
    """Frozen VecNormalize statistics + SB3's policy MLP and action head; forward gives the env action."""

    def __init__(self, cfg: PPOPolicyConfig):
        super().__init__()
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
        a = self.policy_action(state)  # (B, 2)
        steer, accel = a[:, 0], a[:, 1]
        return torch.stack([steer, accel.clamp(min=0.0), self.cfg.brake_scale * (-accel).clamp(min=0.0)], dim=-1)


class PPOExpert:
    """Expert interface: `reset()`, `act(state) -> (3,) float32`. Stateless: the policy is a function of the state."""

    def __init__(self, policy: PPOPolicy):
        self.policy = policy.eval()

    def reset(self) -> None:
        pass

    @torch.no_grad()
    def act(self, state: np.ndarray) -> np.ndarray:
        state = np.asarray(state, dtype=np.float32)
        if state.shape != (self.policy.cfg.obs_dim,):
            raise ValueError(f"PPO expert expects a state of shape ({self.policy.cfg.obs_dim},), got {state.shape}")
        return self.policy(torch.from_numpy(state)[None])[0].numpy().astype(np.float32)
