"""Experts that drive CarRacing from the privileged state: loading by name or path, and a quick scorer.

`load_expert("ppo")` rebuilds the shipped checkpoints/expert_ppo.pt (our checkpoint format, no SB3 needed);
`load_expert("pursuit")` builds the geometric pure-pursuit driver; any other string is read as a path to an expert
checkpoint. Every expert has `reset()` and `act(state) -> (3,) float32` with `state = info["state"]`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

import numpy as np

from drive import checkpoint

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
SHIPPED = {"ppo": REPO / "checkpoints" / "expert_ppo.pt"}


class Expert(Protocol):
    def reset(self) -> None: ...

    def act(self, state: np.ndarray) -> np.ndarray: ...


def pursuit_expert(**overrides):
    from agents.experts.pursuit import PurePursuit, PursuitConfig
    from sim_bridges.carracing import LOOKAHEAD_M, STATE_NAMES

    return PurePursuit(PursuitConfig(state_names=STATE_NAMES, lookahead_m=LOOKAHEAD_M, **overrides))


def load_ppo(path: str | Path):
    """Rebuild the PPO expert from one of our checkpoints; errors name the file and what does not match."""
    from agents.experts.ppo import PPOExpert, PPOPolicy, PPOPolicyConfig
    from sim_bridges.carracing import STATE_NAMES

    payload = checkpoint.read(path, kind="expert")
    if payload.get("name") != "ppo":
        raise checkpoint.CheckpointError(f"{path}: expert {payload.get('name')!r}, expected 'ppo'")
    cfg_dict = dict(payload["config"])
    names = tuple(cfg_dict.pop("state_names", ()))
    if names != STATE_NAMES:
        raise checkpoint.CheckpointError(
            f"{path}: trained on a state layout of {len(names)} features that differs from the bridge's "
            f"{len(STATE_NAMES)} (sim_bridges.carracing.STATE_NAMES); retrain with `drive expert train`"
        )
    try:
        policy = PPOPolicy(PPOPolicyConfig.from_dict(cfg_dict))
        policy.load_state_dict(payload["state_dict"])
    except (TypeError, ValueError, KeyError, RuntimeError) as exc:
        raise checkpoint.CheckpointError(f"{path}: config/weights do not match the PPO expert: {exc}") from exc
    return PPOExpert(policy)


def policy_config(cfg, clip_obs: float = 10.0, obs_eps: float = 1e-8):
    """The exported policy's config from a `drive.expert_train.Config` (and the VecNormalize constants)."""
    from agents.experts.ppo import PPOPolicyConfig
    from sim_bridges.carracing import IDX, STATE_DIM

    return PPOPolicyConfig(
        obs_dim=STATE_DIM, hidden=tuple(cfg.hidden), activation="tanh", brake_scale=cfg.brake_scale,
        action_mode=cfg.action_mode, speed_index=IDX["speed"], clip_obs=clip_obs, obs_eps=obs_eps,
    )  # fmt: skip


def export_policy(model, vecnorm, cfg):
    """SB3 policy + frozen VecNormalize -> our PPOPolicy (deterministic action path only)."""
    import torch

    from agents.experts.ppo import PPOPolicy

    pcfg = policy_config(cfg, float(vecnorm.clip_obs), float(vecnorm.epsilon))
    policy = PPOPolicy(pcfg)
    policy.policy_net.load_state_dict(model.policy.mlp_extractor.policy_net.state_dict())
    policy.action_net.load_state_dict(model.policy.action_net.state_dict())
    policy.obs_mean.copy_(torch.as_tensor(vecnorm.obs_rms.mean, dtype=torch.float32))
    policy.obs_var.copy_(torch.as_tensor(vecnorm.obs_rms.var, dtype=torch.float32))
    return policy.eval(), pcfg


def save_expert(path, policy, pcfg, metrics: dict, extra: dict) -> Path:
    from sim_bridges.carracing import STATE_NAMES

    return checkpoint.save(
        path, kind="expert", name="ppo", config={**pcfg.to_dict(), "state_names": list(STATE_NAMES)},
        module=policy, normalisation={"obs_mean": policy.obs_mean.tolist(), "obs_var": policy.obs_var.tolist()},
        metrics=metrics, extra=extra,
    )  # fmt: skip


def load_expert(name_or_path: str | Path) -> Expert:
    """'ppo' (the shipped checkpoint), 'pursuit', or a path to an expert checkpoint."""
    key = str(name_or_path)
    if key == "pursuit":
        return pursuit_expert()
    if key in SHIPPED:
        return load_ppo(SHIPPED[key])
    path = Path(key)
    if not path.exists():
        raise checkpoint.CheckpointError(f"{key}: not an expert name ({['pursuit', *SHIPPED]}) nor an existing file")
    return load_ppo(path)


def episode_returns(expert: Expert, seeds, mode: str = "state", max_episode_steps: int = 1000, progress=None):
    """Run one deterministic episode per track seed; returns a list of dicts (seed, return, steps, progress).

    `mode="state"` has the same physics and reward as the pixel env, without drawing frames.
    `progress`, when given, is called with each finished episode's dict (e.g. to advance a progress bar).
    """
    from sim_bridges.carracing import make_carracing

    env = make_carracing(mode=mode, max_episode_steps=max_episode_steps, fast_render=mode == "pixels")
    results = []
    try:
        for seed in seeds:
            expert.reset()
            _, info = env.reset(seed=int(seed))
            total, steps, done = 0.0, 0, False
            while not done:
                _, reward, terminated, truncated, info = env.step(expert.act(info["state"]))
                total += reward
                steps += 1
                done = terminated or truncated
            row = {"seed": int(seed), "return": total, "steps": steps, "progress": info["progress"]}
            results.append(row)
            if progress is not None:
                progress(row)
    finally:
        env.close()
    return results


def summarise(results) -> dict[str, float]:
    r = np.array([row["return"] for row in results], dtype=np.float64)
    return {"mean": float(r.mean()), "std": float(r.std()), "min": float(r.min()), "max": float(r.max()), "n": len(r)}
