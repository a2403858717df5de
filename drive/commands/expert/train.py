"""`drive expert train`: PPO (stable-baselines3) on the privileged CarRacing state, selected on held-out tracks; or
`--evaluate NAME` to score an expert on the held-out tracks. The training is drive/learn/ppo_expert.py."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from drive.errors import UserError
from drive.learn.options import PPOExpertOptions
from drive.loop.seeds import parse_seeds

ACCEPTANCE_SEEDS = set(range(1000, 1020))


@dataclass(frozen=True)
class Config(PPOExpertOptions):
    evaluate: str = ""
    """If set ('ppo', 'pursuit' or a checkpoint path): score that expert on eval_seeds (state mode), no training."""
    evaluate_pixels: bool = False
    """With --evaluate: drive the pixel env (fast renderer) instead of state mode; same returns, slower."""


def _evaluate_only(cfg: Config, seeds: list[int]) -> int:
    from drive.learn.ppo_expert import held_out_returns, return_stats
    from drive.loop.specs import load_expert

    mode = "pixels" if cfg.evaluate_pixels else "state"
    results = held_out_returns(load_expert(cfg.evaluate), seeds, mode=mode)
    for row in results:
        print(f"seed {row['seed']}: return {row['return']:.1f}  steps {row['steps']}  progress {row['progress']:.3f}")
    s = return_stats(results)
    print(
        f"{cfg.evaluate} on {cfg.eval_seeds} ({mode} mode): mean {s['mean']:.1f} std {s['std']:.1f} min {s['min']:.1f}"
    )
    return 0


def run(cfg: Config) -> int:
    seeds = parse_seeds(cfg.eval_seeds)
    if cfg.evaluate:
        return _evaluate_only(cfg, seeds)
    if set(seeds) & ACCEPTANCE_SEEDS:
        raise UserError("--eval-seeds overlap 1000-1019, the acceptance seeds: select on other tracks")
    if min(cfg.total_steps, cfg.n_envs, cfg.eval_every) < 1:
        raise UserError("--total-steps, --n-envs and --eval-every must be >= 1")
    from drive.learn.ppo_expert import train_expert  # torch and stable-baselines3: not for `--help`

    command = "drive expert train " + " ".join(sys.argv[3:]) if sys.argv[1:3] == ["expert", "train"] else ""
    best = train_expert(cfg, seeds, command)
    print(f"best held-out score {best:.1f}; exported to {cfg.out or cfg.run_dir / 'expert.pt'}")
    return 0
