"""`drive calibrate --ckpt PATH`: fit the controller's aleatoric temperature on nominal laps in closed loop, so its
90 % interval covers 90 % of its shadow expert's actions on its own states, and store it in the checkpoint.

    drive calibrate --ckpt runs/bc-nsac/best.pt --seeds 2000-2004
    drive calibrate --ckpt runs/bc-nsac/best.pt --out runs/bc-nsac/calibrated.pt --coverage 0.9

The controller drives alone (its temperature reset to 1: rerunning refits, it does not compound) on track seeds
apart from training and evaluation seeds; per action, the factor T on the predicted noise std is the split-conformal
choice on each lap, the median over laps (drive/loop/calibrate.py says why and what it measured). The actions and the
epistemic variance are unchanged, so a stored fallback threshold stays valid; `drive eval` then reports the
calibrated coverage on other seeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from drive.errors import UserError
from drive.loop.seeds import parse_seeds
from drive.options import FloatRange, PositiveInt

Coverage: Any = FloatRange(0.5, 0.999)  # an option type (a range-checked float), like drive.options.Probability


@dataclass(frozen=True)
class Config:
    ckpt: Path
    """controller checkpoint to calibrate (rewritten in place unless --out is given)"""
    seeds: str = "2000-2004"
    """nominal laps: track seeds apart from training and evaluation seeds"""
    coverage: Coverage = 0.9
    """the central interval whose coverage of the shadow expert's actions is fitted"""
    shadow: str | None = None
    """the expert whose actions the intervals should cover (default: the one that labelled the training data)"""
    samples: PositiveInt | None = None
    """stochastic samples per step (default: the controller's own)"""
    out: Path | None = None
    """write the calibrated checkpoint here instead of rewriting --ckpt"""
    rule: Literal["lap-median", "pooled"] = "lap-median"
    """lap-median: T fitted per lap, median over laps (robust to a lap off the road); pooled: one fit on all steps"""
    max_episode_steps: PositiveInt = 1000
    """steps per nominal lap"""


def run(cfg: Config) -> int:
    from drive.loop.calibrate import store_temperature  # torch and the simulator: not for `--help`
    from drive.loop.specs import default_shadow

    shadow = default_shadow(cfg.shadow, "carracing", cfg.ckpt)
    if shadow is None:
        raise UserError("--shadow: calibration fits intervals to a shadow expert's actions: name one (ppo, pursuit)")
    r = store_temperature(
        cfg.ckpt,
        parse_seeds(cfg.seeds),
        shadow,
        cfg.coverage,
        cfg.samples,
        cfg.out,
        {"name": "carracing", "max_episode_steps": cfg.max_episode_steps},
        cfg.rule,
    )
    steer, gas, brake = r["temperature"]
    print(
        f"{cfg.out or cfg.ckpt}: aleatoric temperature steer {steer:.3f}, gas {gas:.3f}, brake {brake:.3f} "
        f"({r['n_steps']} nominal steps on seeds {cfg.seeds}, shadow {shadow}); coverage90 of the expert's "
        f"steering {r['coverage90_steer_before']:.3f} -> {r['coverage90_steer_after']:.3f}"
    )
    return 0
