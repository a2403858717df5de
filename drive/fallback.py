"""Uncertainty-gated fallback: when the controller's epistemic uncertainty is high, hand control over or slow down.

The score is the controller's epistemic variance of one action (steering by default) — the disagreement between its
stochastic samples, i.e. what the model does not know, as opposed to the aleatoric noise it predicts for the
expert. The threshold is calibrated on nominal laps (the controller driving tracks it is not evaluated on, no
fallback): a high quantile of the per-step scores, so that by construction the gate fires on about (1 - q) of
nominal steps and far more often where the controller is lost.

Hysteresis keeps the gate from chattering:
- engage after `engage_steps` consecutive steps above the threshold;
- once engaged, hold for at least `min_hold_steps` and release only after `release_steps` consecutive steps below
  `release_ratio * threshold`.

While engaged, `mode="expert"` executes the shadow expert's action (it acts on the same state every step anyway),
`mode="slow"` keeps the controller's steering but caps gas and brakes gently. Every intervention is logged (start
step, end step, peak score) and counted.

`resolve_threshold` finds the threshold for a checkpoint: given, stored in the checkpoint (extra["fallback"]), or
calibrated now by driving nominal laps (`nominal_scores`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

MODES = ("expert", "slow")
ACTION_NAMES = ("steer", "gas", "brake")


@dataclass(frozen=True)
class FallbackConfig:
    mode: str = "expert"
    """what happens while the gate is engaged: expert (the shadow expert drives) or slow (cap gas, brake gently)"""
    signal: str = "steer"
    """which action's epistemic variance is the score: steer, gas, brake, or sum (sum of the three)"""
    quantile: float = 0.99
    """calibration: the threshold is this quantile of the per-step score on nominal laps"""
    engage_steps: int = 2
    """hysteresis: consecutive steps above the threshold before the gate engages"""
    release_ratio: float = 0.7
    """hysteresis: the gate releases below release_ratio * threshold"""
    release_steps: int = 5
    """hysteresis: consecutive steps below the release level before the gate releases"""
    min_hold_steps: int = 10
    """hysteresis: the gate stays engaged at least this many steps"""
    slow_gas: float = 0.05
    """slow mode: gas is capped at this value"""
    slow_brake: float = 0.1
    """slow mode: brake applied while engaged"""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"fallback mode {self.mode!r}: choose one of {MODES}")
        if self.signal not in (*ACTION_NAMES, "sum"):
            raise ValueError(f"fallback signal {self.signal!r}: choose one of {(*ACTION_NAMES, 'sum')}")
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"fallback quantile {self.quantile} must lie in (0, 1)")
        if not 0.0 < self.release_ratio <= 1.0:
            raise ValueError(f"fallback release_ratio {self.release_ratio} must lie in (0, 1]")
        if min(self.engage_steps, self.release_steps, self.min_hold_steps) < 1:
            raise ValueError("fallback engage_steps, release_steps and min_hold_steps must be >= 1")


def score(epistemic_var: np.ndarray, signal: str = "steer") -> float:
    """The gate's score from one step's epistemic variance per action (steer, gas, brake)."""
    epistemic_var = np.asarray(epistemic_var, dtype=np.float64).reshape(-1)
    if signal == "sum":
        return float(epistemic_var.sum())
    return float(epistemic_var[ACTION_NAMES.index(signal)])


def calibrate_threshold(scores: np.ndarray, quantile: float) -> float:
    """A high quantile of per-step scores recorded on nominal laps (no fallback, tracks not used for evaluation)."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    scores = scores[np.isfinite(scores)]
    if scores.size == 0:
        raise ValueError("cannot calibrate the fallback threshold: no finite scores from the nominal laps")
    return float(np.quantile(scores, quantile))


@dataclass
class Intervention:
    start: int
    end: int | None = None
    peak_score: float = 0.0

    @property
    def n_steps(self) -> int:
        return 0 if self.end is None else self.end - self.start


@dataclass
class FallbackGate:
    """The stateful gate for one episode at a time: `update(score)` each step, `apply(...)` to the action."""

    threshold: float
    cfg: FallbackConfig = field(default_factory=FallbackConfig)

    def __post_init__(self) -> None:
        if not np.isfinite(self.threshold) or self.threshold < 0:
            raise ValueError(f"fallback threshold must be finite and >= 0, got {self.threshold}")
        self.reset()

    def reset(self) -> None:
        self.t = 0
        self.engaged = False
        self._above = 0
        self._below = 0
        self._held = 0
        self.interventions: list[Intervention] = []
        self.n_engaged_steps = 0

    def update(self, value: float) -> bool:
        """Feed one step's score; returns whether the fallback is engaged for this step."""
        if not self.engaged:
            self._above = self._above + 1 if value > self.threshold else 0
            if self._above >= self.cfg.engage_steps:
                self.engaged = True
                self._held = 0
                self._below = 0
                self.interventions.append(Intervention(start=self.t, peak_score=value))
                log.info("fallback engaged at step %d (score %.3g > threshold %.3g)", self.t, value, self.threshold)
        else:
            current = self.interventions[-1]
            current.peak_score = max(current.peak_score, value)
            self._held += 1
            self._below = self._below + 1 if value < self.cfg.release_ratio * self.threshold else 0
            if self._held >= self.cfg.min_hold_steps and self._below >= self.cfg.release_steps:
                self.engaged = False
                self._above = 0
                current.end = self.t
                log.info("fallback released at step %d after %d steps", self.t, current.n_steps)
        self.n_engaged_steps += int(self.engaged)
        self.t += 1
        return self.engaged

    def apply(self, action: np.ndarray, expert_action: np.ndarray | None) -> np.ndarray:
        """The executed action: the controller's unless engaged, then the expert's or a slowed-down one."""
        if not self.engaged:
            return action
        if self.cfg.mode == "expert":
            if expert_action is None:
                raise ValueError("fallback mode 'expert' needs the shadow expert's action")
            return np.asarray(expert_action, dtype=np.float32).copy()
        slowed = np.asarray(action, dtype=np.float32).copy()
        slowed[1] = min(slowed[1], self.cfg.slow_gas)
        slowed[2] = max(slowed[2], self.cfg.slow_brake)
        return slowed

    def close(self) -> None:
        """End of episode: close an intervention still open."""
        if self.engaged and self.interventions and self.interventions[-1].end is None:
            self.interventions[-1].end = self.t

    def summary(self) -> dict:
        self.close()
        return {
            "fallback_threshold": float(self.threshold),
            "n_interventions": len(self.interventions),
            "fallback_steps": int(self.n_engaged_steps),
            "fallback_fraction": float(self.n_engaged_steps / max(self.t, 1)),
            "interventions": [
                {"start": iv.start, "end": iv.end, "peak_score": float(iv.peak_score)} for iv in self.interventions
            ],
        }


# -- calibration on nominal laps ---------------------------------------------------------------------------------
def nominal_scores(policy: Any, seeds: Sequence[int], signal: str, env_kwargs: Mapping[str, Any]) -> np.ndarray:
    """Per-step gate scores of the controller driving alone (no fallback) on `seeds`."""
    if policy.fallback is not None:
        raise ValueError("nominal laps run without a fallback")
    from drive.rollout import make_env, rollout

    scores: list[float] = []
    env = make_env(**{**env_kwargs, "keep_raw": policy.needs_raw or env_kwargs.get("keep_raw", False)})
    try:
        rollout(env, policy, seeds=seeds, on_step=lambda r: scores.append(score(r.extras["epistemic_var"], signal)))
    finally:
        env.close()
    return np.asarray(scores)


def fallback_for_command(cfg: Any, path: str | Path) -> tuple[FallbackConfig | None, float | None, str]:
    """The fallback of `drive eval` / `drive drive` from their shared options (fallback, fallback_threshold,
    calibrate_seeds, samples, seed, env, max_episode_steps): (config, threshold, origin), or (None, None, "off")."""
    if cfg.fallback == "off":
        return None, None, "off"
    from drive.rollout import parse_seeds

    fb = FallbackConfig(mode=cfg.fallback)
    threshold, origin = resolve_threshold(
        path, fb, cfg.fallback_threshold, parse_seeds(cfg.calibrate_seeds), cfg.samples, cfg.seed,
        {"name": cfg.env, "max_episode_steps": cfg.max_episode_steps},
    )  # fmt: skip
    return fb, threshold, origin


def resolve_threshold(
    path: str | Path,
    cfg: FallbackConfig,
    threshold: float | None = None,
    calibrate_seeds: Sequence[int] = (),
    n_samples: int | None = None,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
) -> tuple[float, str]:
    """The fallback threshold and where it came from: given; stored in the checkpoint's extra["fallback"] (same
    signal, quantile and samples); else calibrated now on nominal laps over `calibrate_seeds`, as the `cfg.quantile`
    quantile of the controller's per-step score."""
    if threshold is not None:
        return float(threshold), "given"
    from drive.checkpoint import read
    from drive.policies import load_controller_policy

    policy = load_controller_policy(path, n_samples, seed, shadow=None, env=(env_kwargs or {}).get("name", "carracing"))
    stored = read(path, kind="controller").get("extra", {}).get("fallback") or {}
    wanted = {"signal": cfg.signal, "quantile": cfg.quantile, "n_samples": policy.n_samples}
    if stored and all(stored.get(k) == v for k, v in wanted.items()):
        return float(stored["threshold"]), f"checkpoint (calibrated on seeds {stored.get('seeds')})"
    if not calibrate_seeds:
        raise ValueError(f"{path}: no fallback threshold stored for {wanted}; give one or seeds to calibrate on")
    values = nominal_scores(policy, calibrate_seeds, cfg.signal, env_kwargs or {})
    value = calibrate_threshold(values, cfg.quantile)
    log.info("fallback threshold %.4g (q=%.3f of %d nominal steps on seeds %s)", value, cfg.quantile, len(values),
             list(calibrate_seeds))  # fmt: skip
    return value, f"calibrated on seeds {list(calibrate_seeds)} ({len(values)} nominal steps)"


def store_threshold(path: str | Path, cfg: FallbackConfig, calibrate_seeds: Sequence[int], n_samples: int | None = None,
                    env_kwargs: Mapping[str, Any] | None = None) -> float:  # fmt: skip
    """Calibrate on nominal laps and write the threshold into the checkpoint's extra["fallback"] (atomically), so
    `drive eval --fallback` and `drive drive --fallback` use it without driving the nominal laps again."""
    from drive import checkpoint
    from drive.policies import load_controller_policy

    payload = checkpoint.read(path, kind="controller")
    policy = load_controller_policy(path, n_samples, 0, shadow=None, env=(env_kwargs or {}).get("name", "carracing"))
    values = nominal_scores(policy, calibrate_seeds, cfg.signal, env_kwargs or {})
    value = calibrate_threshold(values, cfg.quantile)
    extra = {**payload["extra"], "fallback": {"threshold": value, "signal": cfg.signal, "quantile": cfg.quantile,
                                              "n_samples": policy.n_samples, "seeds": list(map(int, calibrate_seeds)),
                                              "n_steps": int(len(values))}}  # fmt: skip
    checkpoint.save(path, kind="controller", name=payload["name"], config=payload["config"], module=policy.model,
                    normalisation=payload["normalisation"], data=payload["data"], metrics=payload["metrics"],
                    extra=extra)  # fmt: skip
    return value


@dataclass(frozen=True)
class CalibrateConfig:
    ckpt: Path
    """controller checkpoint to calibrate (rewritten with the threshold in extra["fallback"])"""
    seeds: str = "2000-2004"
    """nominal laps: track seeds apart from training and evaluation seeds"""
    quantile: float = 0.99
    """the threshold is this quantile of the per-step epistemic variance on the nominal laps"""
    signal: str = "steer"
    """steer, gas, brake or sum"""
    samples: int | None = None
    """stochastic samples per step (default: the controller's own)"""


if __name__ == "__main__":  # python -m drive.fallback --ckpt PATH
    import tyro

    from drive.rollout import parse_seeds

    c = tyro.cli(CalibrateConfig)
    t = store_threshold(c.ckpt, FallbackConfig(quantile=c.quantile, signal=c.signal), parse_seeds(c.seeds), c.samples)
    print(f"{c.ckpt}: fallback threshold {t:.4g} (q={c.quantile} of {c.signal} epistemic variance on seeds {c.seeds})")
