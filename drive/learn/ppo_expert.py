"""The PPO expert (`drive expert train`): PPO (stable-baselines3) on the privileged CarRacing state, selected on
held-out tracks.

Training runs in state mode (same physics and reward as the pixel env, no frames drawn) on SubprocVecEnv workers;
each reset draws a new track from the worker's RNG stream. Every `eval_every` steps the deterministic policy is
exported into our checkpoint format (frozen VecNormalize statistics included) and scored on the held-out seeds;
the best by `mean + min_weight * min` is kept and exported to `out`. Everything lands in the run directory:
config.json, eval.csv / eval.json / eval.png (the curve), sb3_last.zip + vecnorm_last.pkl (for --resume; internal,
never shipped), expert_best.pt (our format). Training-only episode shaping (ending an episode after a long
off-track stretch) never touches evaluation, which uses the true env reward and the 1000-step limit.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.experts.ppo import PPOExpert, PPOPolicy, PPOPolicyConfig
from drive import checkpoint
from drive.errors import UserError
from drive.learn.options import PPOExpertOptions
from drive.learn.ppo_envs import make_env
from sim_bridges.carracing.bridge import IDX, STATE_DIM, STATE_NAMES, make_carracing

log = logging.getLogger(__name__)


def policy_config(cfg: PPOExpertOptions, clip_obs: float = 10.0, obs_eps: float = 1e-8) -> PPOPolicyConfig:
    """The exported policy's config from the training options (and the VecNormalize constants)."""
    return PPOPolicyConfig(
        obs_dim=STATE_DIM,
        hidden=tuple(cfg.hidden),
        activation="tanh",
        brake_scale=cfg.brake_scale,
        action_mode=cfg.action_mode,
        speed_index=IDX["speed"],
        clip_obs=clip_obs,
        obs_eps=obs_eps,
    )


def export_policy(model: Any, vecnorm: Any, cfg: PPOExpertOptions) -> tuple[PPOPolicy, PPOPolicyConfig]:
    """SB3 policy + frozen VecNormalize -> our PPOPolicy (deterministic action path only)."""
    pcfg = policy_config(cfg, float(vecnorm.clip_obs), float(vecnorm.epsilon))
    policy = PPOPolicy(pcfg)
    policy.policy_net.load_state_dict(model.policy.mlp_extractor.policy_net.state_dict())
    policy.action_net.load_state_dict(model.policy.action_net.state_dict())
    policy.obs_mean.copy_(torch.as_tensor(vecnorm.obs_rms.mean, dtype=torch.float32))
    policy.obs_var.copy_(torch.as_tensor(vecnorm.obs_rms.var, dtype=torch.float32))
    return policy.eval(), pcfg


def save_expert(path: Path, policy: PPOPolicy, pcfg: PPOPolicyConfig, metrics: dict, extra: dict) -> Path:
    return checkpoint.save(
        path,
        kind="expert",
        name="ppo",
        config={**pcfg.to_dict(), "state_names": list(STATE_NAMES)},
        module=policy,
        normalisation={"obs_mean": policy.obs_mean.tolist(), "obs_var": policy.obs_var.tolist()},
        metrics=metrics,
        extra=extra,
    )


def held_out_returns(expert: Any, seeds: list[int], mode: str = "state", max_episode_steps: int = 1000) -> list[dict]:
    """One deterministic episode per track seed (state mode: same physics and reward, no frames drawn)."""
    env = make_carracing(mode=mode, max_episode_steps=max_episode_steps, fast_render=mode == "pixels")
    results = []
    try:
        for seed in seeds:
            expert.reset()
            _, info = env.reset(seed=int(seed))
            total, steps, done = 0.0, 0, False
            while not done:
                _, reward, terminated, truncated, info = env.step(expert.act(info["state"]))
                total, steps, done = total + float(reward), steps + 1, terminated or truncated
            results.append({"seed": int(seed), "return": total, "steps": steps, "progress": info["progress"]})
    finally:
        env.close()
    return results


def return_stats(results: list[dict]) -> dict[str, float]:
    r = np.array([row["return"] for row in results], dtype=np.float64)
    return {"mean": float(r.mean()), "std": float(r.std()), "min": float(r.min()), "max": float(r.max()), "n": len(r)}


def _write_curve(run_dir: Path, history: list[dict]) -> None:
    (run_dir / "eval.json").write_text(json.dumps(history, indent=1))
    with open(run_dir / "eval.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(history[0]))
        writer.writeheader()
        writer.writerows(history)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["steps"] for h in history]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [h["mean"] for h in history], "o-", label="held-out mean")
    ax.plot(steps, [h["min"] for h in history], "s--", label="held-out min")
    ax.axhline(880, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="environment steps", ylabel="episode return", title="PPO expert, deterministic, held-out tracks")
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / "eval.png", dpi=100)
    plt.close(fig)


def _ppo(cfg: PPOExpertOptions, run_dir: Path, last_zip: Path, last_norm: Path) -> tuple[Any, Any, list[dict]]:
    """The SB3 model and normalised vector env, new or resumed from the run directory, and the evaluation history."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    fns = [make_env(cfg, i, policy_config(cfg)) for i in range(cfg.n_envs)]
    venv = SubprocVecEnv(fns) if cfg.n_envs > 1 else DummyVecEnv(fns)
    history: list[dict] = []
    if cfg.resume:
        if not (last_zip.is_file() and last_norm.is_file()):
            raise UserError(f"--resume: {last_zip} or {last_norm} missing (nothing to resume in {run_dir})")
        venv = VecNormalize.load(str(last_norm), venv)
        model = PPO.load(str(last_zip), env=venv, device="cpu")
        if (run_dir / "eval.json").is_file():
            history = json.loads((run_dir / "eval.json").read_text())
        log.info("resumed at %d steps", model.num_timesteps)
        return model, venv, history
    venv = VecNormalize(venv, norm_obs=True, norm_reward=True, clip_obs=10.0, gamma=cfg.gamma)
    lr0, lr1 = cfg.lr, cfg.lr_final
    model = PPO(
        "MlpPolicy",
        venv,
        learning_rate=lambda p: lr1 + p * (lr0 - lr1),
        n_steps=cfg.n_steps,
        batch_size=cfg.batch_size,
        n_epochs=cfg.n_epochs,
        gamma=cfg.gamma,
        gae_lambda=cfg.gae_lambda,
        clip_range=cfg.clip_range,
        ent_coef=cfg.ent_coef,
        use_sde=cfg.use_sde,
        sde_sample_freq=4,
        policy_kwargs=dict(
            net_arch=dict(pi=list(cfg.hidden), vf=list(cfg.hidden)),
            activation_fn=torch.nn.Tanh,
            log_std_init=cfg.log_std_init,
        ),
        seed=cfg.seed,
        device="cpu",
        verbose=0,
    )
    return model, venv, history


class _Selector:
    """Scores the deterministic policy on the held-out tracks, keeps the curve and the resumable state, exports the
    best by mean + min_weight * min."""

    def __init__(
        self, cfg: PPOExpertOptions, seeds: list[int], model: Any, venv: Any, history: list[dict], command: str
    ):
        self.cfg, self.seeds, self.model, self.venv = cfg, seeds, model, venv
        self.history, self.command = history, command
        self.run_dir = Path(cfg.run_dir)
        self.out = cfg.out or self.run_dir / "expert.pt"
        self.best = max((h["score"] for h in history), default=-np.inf)
        self.t0 = time.time() - (history[-1]["wall_s"] if history else 0.0)

    def __call__(self) -> None:
        cfg, model = self.cfg, self.model
        policy, pcfg = export_policy(model, self.venv, cfg)
        s = return_stats(held_out_returns(PPOExpert(policy), self.seeds, mode="state"))
        score = s["mean"] + cfg.min_weight * s["min"]
        row = {"steps": int(model.num_timesteps), "wall_s": round(time.time() - self.t0, 1), **s, "score": score}
        self.history.append(row)
        print(
            f"[eval] {row['steps']:>9d} steps  held-out mean {s['mean']:7.1f}  std {s['std']:6.1f}  "
            f"min {s['min']:7.1f}  score {score:7.1f}  ({row['wall_s']:.0f}s)",
            flush=True,
        )
        _write_curve(self.run_dir, self.history)
        model.save(str(self.run_dir / "sb3_last.zip"))
        self.venv.save(str(self.run_dir / "vecnorm_last.pkl"))
        if score > self.best:
            self.best = score
            metrics = {f"heldout_{k}": float(v) for k, v in s.items()}
            extra = {
                "command": self.command,
                "steps": row["steps"],
                "seed": cfg.seed,
                "eval_seeds": cfg.eval_seeds,
                "wall_s": row["wall_s"],
            }
            save_expert(self.run_dir / "expert_best.pt", policy, pcfg, metrics, extra)
            save_expert(self.out, policy, pcfg, metrics, extra)
            print(f"[eval] new best -> {self.out}", flush=True)


def _callback(cfg: PPOExpertOptions, model: Any, venv: Any, evaluate: _Selector) -> Any:
    """SB3 callback: a log line every 50k steps (the progress bar needs a terminal), an evaluation every eval_every."""
    from stable_baselines3.common.callbacks import BaseCallback

    class EvalEvery(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_eval = (model.num_timesteps // cfg.eval_every + 1) * cfg.eval_every
            self.next_log = model.num_timesteps + 50_000
            self.t_steps = (time.time(), model.num_timesteps)

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next_log:
                self.next_log += 50_000
                ret = np.mean([ep["r"] for ep in model.ep_info_buffer]) if model.ep_info_buffer else float("nan")
                fps = (self.num_timesteps - self.t_steps[1]) / max(time.time() - self.t_steps[0], 1e-9)
                self.t_steps = (time.time(), self.num_timesteps)
                line = f"[train] {self.num_timesteps:>9d} steps  {fps:6.0f} steps/s  train return {ret:7.1f}"
                print(line, flush=True)
            if self.num_timesteps >= self.next_eval:
                self.next_eval += cfg.eval_every
                venv.training = False  # freeze statistics while scoring (eval runs its own env anyway)
                evaluate()
                venv.training = True
            return True

    return EvalEvery()


def train_expert(cfg: PPOExpertOptions, seeds: list[int], command: str = "") -> float:
    """Train (or resume) PPO, evaluating and exporting every eval_every steps; returns the best held-out score."""
    from stable_baselines3.common.logger import Logger

    torch.set_num_threads(1)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_json = {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()}
    (run_dir / "config.json").write_text(json.dumps(cfg_json, indent=1))
    model, venv, history = _ppo(cfg, run_dir, run_dir / "sb3_last.zip", run_dir / "vecnorm_last.pkl")
    evaluate = _Selector(cfg, seeds, model, venv, history, command)
    remaining = cfg.total_steps - model.num_timesteps
    if remaining > 0:
        model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's default makes an empty /tmp/SB3-* per run
        model.learn(
            remaining,
            callback=_callback(cfg, model, venv, evaluate),
            progress_bar=True,
            reset_num_timesteps=not cfg.resume,
        )
    if not history or history[-1]["steps"] != model.num_timesteps:
        evaluate()
    venv.close()
    return float(evaluate.best)
