"""`drive expert train`: PPO (stable-baselines3) on the privileged CarRacing state, selected on held-out tracks.

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
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np

from drive.experts import export_policy, policy_config, save_expert
from sim_bridges.carracing import IDX, TRACK_HALF_WIDTH

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    run_dir: Path = Path("runs/expert_ppo")
    """Run directory: config, evaluation curve, resumable SB3 state, best checkpoint."""
    out: Path | None = None
    """Where the best held-out checkpoint is exported (our format); default RUN_DIR/expert.pt. Never defaults to
    the shipped checkpoints/expert_ppo.pt, so a new run cannot overwrite it by accident."""
    total_steps: int = 3_000_000
    """Environment steps to train for (all workers together)."""
    n_envs: int = 2
    """Parallel training environments (SubprocVecEnv when > 1)."""
    seed: int = 0
    """Seed for PPO and the training workers' track streams."""
    resume: bool = False
    """Continue a killed run from its last evaluation (run_dir/sb3_last.zip, vecnorm_last.pkl, eval.json)."""
    eval_every: int = 250_000
    """Evaluate (and maybe keep) the deterministic policy every this many steps."""
    eval_seeds: str = "5000-5049"
    """Held-out track seeds for selection, as 'a-b' (inclusive) or 'a,b,c'. Never use 1000-1019 here."""
    min_weight: float = 0.5
    """Selection score = mean return + min_weight * min return over the held-out seeds."""
    offtrack_patience: int = 60
    """Training only: end an episode after this many consecutive steps with no wheel on the road (0 = never)."""
    offtrack_penalty: float = 100.0
    """Training only: reward subtracted when an episode is ended for being off track."""
    perturb_prob: float = 0.25
    """Training only: chance an episode starts at a random track point, heading and lateral offset (recoveries)."""
    wheel_off_penalty: float = 0.02
    """Training only: reward subtracted per step for each wheel off the road (discourages cutting corners)."""
    lr: float = 3e-4
    """Initial learning rate, decayed linearly to lr_final."""
    lr_final: float = 3e-5
    """Learning rate at the end of training."""
    n_steps: int = 1024
    """Rollout length per environment between updates."""
    batch_size: int = 256
    """Minibatch size."""
    n_epochs: int = 5
    """Passes over each rollout."""
    gamma: float = 0.995
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_range: float = 0.2
    """PPO clip range."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    log_std_init: float = -1.0
    """Initial log standard deviation of the Gaussian policy."""
    use_sde: bool = True
    """Generalised state-dependent exploration (smoother exploration than per-step noise)."""
    hidden: tuple[int, ...] = (128, 128)
    """Hidden widths of the policy and value MLPs."""
    action_mode: str = "speed"
    """Pedal axis of the policy: 'speed' (target speed tracked by a servo) or 'accel' (gas/brake directly)."""
    brake_scale: float = 0.8
    """Largest brake the policy can apply (0.9 and above locks the wheels)."""
    evaluate: str = ""
    """If set ('ppo', 'pursuit' or a checkpoint path): score that expert on eval_seeds (state mode), no training."""
    evaluate_pixels: bool = False
    """With --evaluate: drive the pixel env (fast renderer) instead of state mode; same returns, slower."""


def parse_seeds(spec: str) -> list[int]:
    """'5000-5049' -> [5000..5049]; '1,2,7' -> [1, 2, 7]."""
    try:
        if "-" in spec.strip("-"):
            a, b = spec.split("-")
            return list(range(int(a), int(b) + 1))
        return [int(s) for s in spec.split(",") if s.strip()]
    except ValueError as exc:
        raise ValueError(f"seeds must look like '5000-5049' or '1,2,3', got {spec!r}") from exc


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
        import torch

        from agents.experts.ppo import to_env_action

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


def _make_env(cfg: Config, rank: int):
    def thunk():
        import torch
        from stable_baselines3.common.monitor import Monitor

        from sim_bridges.carracing import make_carracing

        torch.set_num_threads(1)
        env = make_carracing(mode="state")
        env = TrainShaping(env, cfg.offtrack_patience, cfg.offtrack_penalty, cfg.wheel_off_penalty, cfg.perturb_prob)
        env = Monitor(PolicyAction(env, policy_config(cfg)))
        env.reset(seed=cfg.seed * 1000 + rank)
        return env

    return thunk


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


def _evaluate_only(cfg: Config) -> int:
    from drive.experts import episode_returns, load_expert, summarise

    seeds = parse_seeds(cfg.eval_seeds)
    mode = "pixels" if cfg.evaluate_pixels else "state"
    results = episode_returns(load_expert(cfg.evaluate), seeds, mode=mode)
    for row in results:
        print(f"seed {row['seed']}: return {row['return']:.1f}  steps {row['steps']}  progress {row['progress']:.3f}")
    s = summarise(results)
    print(
        f"{cfg.evaluate} on {cfg.eval_seeds} ({mode} mode): mean {s['mean']:.1f} std {s['std']:.1f} min {s['min']:.1f}"
    )
    return 0


def run(cfg: Config) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if cfg.out is None:
        cfg = dataclasses.replace(cfg, out=cfg.run_dir / "expert.pt")
    if cfg.evaluate:
        return _evaluate_only(cfg)
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    from agents.experts.ppo import PPOExpert
    from drive.experts import episode_returns, summarise

    torch.set_num_threads(1)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    seeds = parse_seeds(cfg.eval_seeds)
    if set(seeds) & set(range(1000, 1020)):
        raise ValueError("eval_seeds overlap 1000-1019, the acceptance seeds: select on other tracks")
    cfg_json = {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()}
    (run_dir / "config.json").write_text(json.dumps(cfg_json, indent=1))
    command = "drive expert train " + " ".join(sys.argv[3:]) if sys.argv[1:3] == ["expert", "train"] else ""

    fns = [_make_env(cfg, i) for i in range(cfg.n_envs)]
    venv = SubprocVecEnv(fns) if cfg.n_envs > 1 else DummyVecEnv(fns)
    last_zip, last_norm = run_dir / "sb3_last.zip", run_dir / "vecnorm_last.pkl"
    history: list[dict] = []
    if cfg.resume:
        if not (last_zip.is_file() and last_norm.is_file()):
            raise FileNotFoundError(f"--resume: {last_zip} or {last_norm} missing")
        venv = VecNormalize.load(str(last_norm), venv)
        model = PPO.load(str(last_zip), env=venv, device="cpu")
        if (run_dir / "eval.json").is_file():
            history = json.loads((run_dir / "eval.json").read_text())
        log.info("resumed at %d steps", model.num_timesteps)
    else:
        venv = VecNormalize(venv, norm_obs=True, norm_reward=True, clip_obs=10.0, gamma=cfg.gamma)
        lr0, lr1 = cfg.lr, cfg.lr_final
        model = PPO(
            "MlpPolicy", venv, learning_rate=lambda p: lr1 + p * (lr0 - lr1), n_steps=cfg.n_steps,
            batch_size=cfg.batch_size, n_epochs=cfg.n_epochs, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
            clip_range=cfg.clip_range, ent_coef=cfg.ent_coef, use_sde=cfg.use_sde, sde_sample_freq=4,
            policy_kwargs=dict(net_arch=dict(pi=list(cfg.hidden), vf=list(cfg.hidden)),
                               activation_fn=torch.nn.Tanh, log_std_init=cfg.log_std_init),
            seed=cfg.seed, device="cpu", verbose=0,
        )  # fmt: skip
    best = max((h["score"] for h in history), default=-np.inf)
    t0 = time.time() - (history[-1]["wall_s"] if history else 0.0)

    def evaluate_now():
        nonlocal best
        policy, pcfg = export_policy(model, venv, cfg)
        s = summarise(episode_returns(PPOExpert(policy), seeds, mode="state"))
        score = s["mean"] + cfg.min_weight * s["min"]
        row = {"steps": int(model.num_timesteps), "wall_s": round(time.time() - t0, 1), **s, "score": score}
        history.append(row)
        print(f"[eval] {row['steps']:>9d} steps  held-out mean {s['mean']:7.1f}  std {s['std']:6.1f}  "
              f"min {s['min']:7.1f}  score {score:7.1f}  ({row['wall_s']:.0f}s)", flush=True)  # fmt: skip
        _write_curve(run_dir, history)
        model.save(str(last_zip))
        venv.save(str(last_norm))
        if score > best:
            best = score
            metrics = {f"heldout_{k}": float(v) for k, v in s.items()}
            extra = {"command": command, "steps": row["steps"], "seed": cfg.seed, "eval_seeds": cfg.eval_seeds,
                     "wall_s": row["wall_s"]}  # fmt: skip
            save_expert(run_dir / "expert_best.pt", policy, pcfg, metrics, extra)
            save_expert(cfg.out, policy, pcfg, metrics, extra)
            print(f"[eval] new best -> {cfg.out}", flush=True)

    class EvalEvery(BaseCallback):
        def __init__(self):
            super().__init__()
            self.next_eval = (model.num_timesteps // cfg.eval_every + 1) * cfg.eval_every
            self.next_log = model.num_timesteps + 50_000
            self.t_steps = (time.time(), model.num_timesteps)

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next_log:  # plain log lines too: the progress bar needs a terminal
                self.next_log += 50_000
                ret = np.mean([ep["r"] for ep in model.ep_info_buffer]) if model.ep_info_buffer else float("nan")
                fps = (self.num_timesteps - self.t_steps[1]) / max(time.time() - self.t_steps[0], 1e-9)
                self.t_steps = (time.time(), self.num_timesteps)
                print(
                    f"[train] {self.num_timesteps:>9d} steps  {fps:6.0f} steps/s  train return {ret:7.1f}", flush=True
                )
            if self.num_timesteps >= self.next_eval:
                self.next_eval += cfg.eval_every
                venv.training = False  # freeze statistics while scoring (eval runs its own env anyway)
                evaluate_now()
                venv.training = True
            return True

    remaining = cfg.total_steps - model.num_timesteps
    if remaining > 0:
        model.learn(remaining, callback=EvalEvery(), progress_bar=True, reset_num_timesteps=not cfg.resume)
    if not history or history[-1]["steps"] != model.num_timesteps:
        evaluate_now()
    venv.close()
    print(f"best held-out score {best:.1f}; exported to {cfg.out}")
    return 0
