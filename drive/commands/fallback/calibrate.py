"""`drive fallback calibrate --ckpt PATH`: drive the controller alone on nominal laps, take a high quantile of its
per-step epistemic (or total) variance as the fallback gate's threshold, and store it in the checkpoint
(extra["fallback"]), so `drive eval --fallback` and `drive drive --fallback` use it without driving the laps again.
A threshold that could never fire (a controller without epistemic variance, every step scored alike) is refused."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from drive.loop.seeds import parse_seeds
from drive.options import OpenUnit, PositiveInt


@dataclass(frozen=True)
class Config:
    ckpt: Path
    """controller checkpoint to calibrate (rewritten with the threshold in extra["fallback"])"""
    seeds: str = "2000-2004"
    """nominal laps: track seeds apart from training and evaluation seeds"""
    quantile: OpenUnit = 0.99
    """the threshold is this quantile of the per-step variance on the nominal laps"""
    signal: Literal["steer", "gas", "brake", "sum"] = "steer"
    """which action's variance is the gate's score"""
    variance: Literal["epistemic", "total"] = "epistemic"
    """which variance: epistemic (the samples' disagreement) or total (aleatoric + epistemic; for a controller
    without epistemic variance, e.g. gmle); `drive eval --fallback expert:variance=total` reads a total one"""
    samples: PositiveInt | None = None
    """stochastic samples per step (default: the controller's own)"""


def run(cfg: Config) -> int:
    from drive.loop.fallback import FallbackConfig  # torch and the simulator: not for `--help`
    from drive.loop.thresholds import store_threshold

    fb = FallbackConfig(quantile=cfg.quantile, signal=cfg.signal, variance=cfg.variance)
    value = store_threshold(cfg.ckpt, fb, parse_seeds(cfg.seeds), cfg.samples, {"name": "carracing"})
    print(
        f"{cfg.ckpt}: fallback threshold {value:.4g} (q={cfg.quantile} of {cfg.signal} {cfg.variance} variance on "
        f"seeds {cfg.seeds})"
    )
    return 0
