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

The threshold for a checkpoint (given, stored in it, or calibrated on nominal laps) comes from
drive/loop/thresholds.py; this module is the gate alone and imports nothing of the loop.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import numpy as np

from drive.errors import UserError
from drive.options import NonNegativeInt, OpenUnit, PositiveInt, Probability
from sim_bridges.carracing.bridge import ACTION_NAMES

log = logging.getLogger(__name__)

MODES = ("expert", "slow")
VARIANCES = ("epistemic", "total")


@dataclass(frozen=True)
class FallbackConfig:
    mode: str = "expert"
    """what happens while the gate is engaged: expert (the shadow expert drives) or slow (cap gas, brake gently)"""
    signal: str = "steer"
    """which action's variance is the score: steer, gas, brake, or sum (sum of the three)"""
    variance: str = "epistemic"
    """which variance is the score: epistemic (the samples' disagreement) or total (aleatoric + epistemic)"""
    quantile: OpenUnit = 0.99
    """calibration: the threshold is this quantile of the per-step score on nominal laps"""
    engage_steps: PositiveInt = 2
    """hysteresis: consecutive steps above the threshold before the gate engages"""
    release_ratio: OpenUnit = 0.7
    """hysteresis: the gate releases below release_ratio * threshold"""
    release_steps: PositiveInt = 5
    """hysteresis: consecutive steps below the release level before the gate releases"""
    min_hold_steps: NonNegativeInt = 10
    """hysteresis: the gate stays engaged at least this many steps"""
    slow_gas: Probability = 0.05
    """slow mode: gas is capped at this value"""
    slow_brake: Probability = 0.1
    """slow mode: brake applied while engaged"""
    blend_steps: NonNegativeInt = 0
    """0: switch; N > 0: blend, the executed action moves from the controller's to the fallback's over N steps
    after engaging and back over N steps after releasing (no step change of the controls mid-manoeuvre)"""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UserError(f"fallback mode {self.mode!r}: choose one of {MODES}")
        if self.variance not in VARIANCES:
            raise UserError(f"fallback variance {self.variance!r}: choose one of {VARIANCES}")
        if self.signal not in (*ACTION_NAMES, "sum"):
            raise UserError(f"fallback signal {self.signal!r}: choose one of {(*ACTION_NAMES, 'sum')}")
        if not 0.0 < self.quantile < 1.0:
            raise UserError(f"fallback quantile {self.quantile} must lie in (0, 1)")
        if not 0.0 < self.release_ratio <= 1.0:
            raise UserError(f"fallback release_ratio {self.release_ratio} must lie in (0, 1]")
        if min(self.engage_steps, self.release_steps, self.min_hold_steps) < 1:
            raise UserError("fallback engage_steps, release_steps and min_hold_steps must be >= 1")
        if self.blend_steps < 0:
            raise UserError(f"fallback blend_steps {self.blend_steps} must be >= 0")


def parse_fallback(text: str) -> FallbackConfig | None:
    """'off' -> None; 'expert' / 'slow' -> that mode with the designed defaults; 'expert:blend_steps=0,
    min_hold_steps=30' -> with those fields overridden (any FallbackConfig field, cast to its type)."""
    mode, _, rest = str(text).partition(":")
    if mode == "off":
        return None
    fields = {f.name: f for f in dataclasses.fields(FallbackConfig)}
    overrides: dict[str, object] = {}
    for item in (part for part in rest.split(",") if part.strip()):
        key, sep, value = item.strip().partition("=")
        if not sep or key not in fields or key == "mode":
            raise UserError(f"fallback {text!r}: expected MODE[:KEY=VALUE,...] with KEY among {sorted(fields)[:-1]}")
        kind = type(getattr(FallbackConfig(), key))
        try:
            overrides[key] = kind(value)
        except ValueError:
            raise UserError(f"fallback {text!r}: {key}={value!r} is not a {kind.__name__}") from None
    return FallbackConfig(mode=mode, **overrides)  # type: ignore[arg-type]


def score(epistemic_var: np.ndarray, signal: str = "steer") -> float:
    """The gate's score from one step's epistemic variance per action (steer, gas, brake)."""
    epistemic_var = np.asarray(epistemic_var, dtype=np.float64).reshape(-1)
    if signal == "sum":
        return float(epistemic_var.sum())
    return float(epistemic_var[ACTION_NAMES.index(signal)])


def prediction_variance(prediction, variance: str = "epistemic") -> np.ndarray:
    """The variance per action of a StepPrediction that a gate scores: epistemic or total."""
    epi = np.asarray(prediction.epistemic_var, dtype=np.float64)
    return epi if variance == "epistemic" else epi + np.asarray(prediction.aleatoric_var, dtype=np.float64)


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
        self.weight = 0.0  # the fallback's share of the executed action (blend), 0 or 1 when switching

    def score(self, epistemic_var: np.ndarray) -> float:
        """This gate's score of one step's epistemic variance per action."""
        return score(epistemic_var, self.cfg.signal)

    def score_of(self, prediction) -> float:
        """This gate's score of one step's prediction (a StepPrediction): its configured variance and signal."""
        return score(prediction_variance(prediction, self.cfg.variance), self.cfg.signal)

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
        step = 1.0 / self.cfg.blend_steps if self.cfg.blend_steps else 1.0
        self.weight = min(1.0, self.weight + step) if self.engaged else max(0.0, self.weight - step)
        return self.engaged

    def apply(self, action: np.ndarray, expert_action: np.ndarray | None) -> np.ndarray:
        """The executed action: the controller's while the fallback's weight is 0, else blended towards (or switched
        to) the expert's or a slowed-down one."""
        if self.weight <= 0.0:
            return action
        if self.cfg.mode == "expert":
            if expert_action is None:
                raise ValueError("fallback mode 'expert' needs the shadow expert's action")
            target = np.asarray(expert_action, dtype=np.float32)
        else:
            target = np.asarray(action, dtype=np.float32).copy()
            target[1] = min(target[1], self.cfg.slow_gas)
            target[2] = max(target[2], self.cfg.slow_brake)
        w = np.float32(self.weight)
        return ((1 - w) * np.asarray(action, dtype=np.float32) + w * target).astype(np.float32)

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
