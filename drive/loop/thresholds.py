"""The fallback gate's threshold for a checkpoint: given, stored in the checkpoint, or calibrated on nominal laps.

Calibration drives the controller alone (no fallback) on track seeds apart from training and evaluation seeds and
takes a high quantile of its per-step gate score (`drive.loop.fallback.calibrate_threshold`): by construction the
gate then fires on about (1 - q) of nominal steps, and far more often where the controller is lost.
`store_threshold` writes it into the checkpoint's extra["fallback"], so later runs skip the nominal laps; it refuses,
writing nothing, a gate that could never fire (a score of exactly 0: GMLE's epistemic variance, any controller at one
sample) and a threshold that separates nothing (every nominal step scored alike, or a quantile of 0).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from datasets.frames import RAW_SHAPE
from drive import checkpoint
from drive.errors import UserError
from drive.loop.envs import make_env
from drive.loop.fallback import FallbackConfig, calibrate_threshold, parse_fallback, prediction_variance, score
from drive.loop.policies import ControllerPolicy
from drive.loop.rollout import StepRecord, rollout
from drive.loop.seeds import parse_seeds
from drive.loop.specs import controller_policy

log = logging.getLogger(__name__)


def nominal_scores(
    policy: ControllerPolicy,
    seeds: Sequence[int],
    signal: str,
    env_kwargs: Mapping[str, Any],
    variance: str = "epistemic",
) -> np.ndarray:
    """Per-step gate scores of the controller driving alone (no fallback) on `seeds`."""
    if policy.gate is not None:
        raise ValueError("nominal laps run without a fallback")
    scores: list[float] = []

    def observe(record: StepRecord) -> None:
        assert record.output.prediction is not None
        scores.append(score(prediction_variance(record.output.prediction, variance), signal))

    env = make_env(**env_kwargs)
    try:
        rollout(env, policy, seeds=seeds, on_step=observe)
    finally:
        env.close()
    return np.asarray(scores)


def resolve_threshold(
    path: str | Path,
    cfg: FallbackConfig,
    threshold: float | None = None,
    calibrate_seeds: Sequence[int] = (),
    samples: int | None = None,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
) -> tuple[float, str]:
    """The threshold and where it came from: given; stored in the checkpoint's extra["fallback"] (same signal,
    quantile and samples); else calibrated now on nominal laps over `calibrate_seeds`."""
    if threshold is not None:
        return float(threshold), "given"
    env_kwargs = dict(env_kwargs or {})
    policy = controller_policy(path, samples, seed, shadow=None, env=env_kwargs.get("name", "carracing"))
    payload = checkpoint.read(path, kind="controller")
    stored = payload.get("extra", {}).get("fallback") or {}
    wanted = {"signal": cfg.signal, "quantile": cfg.quantile, "n_samples": policy.samples, "variance": cfg.variance}
    stored = {"variance": "epistemic", **stored} if stored else stored  # stored before gates had a variance choice
    if stored and all(stored.get(k) == v for k, v in wanted.items()):
        return float(stored["threshold"]), f"checkpoint (calibrated on seeds {stored.get('seeds')})"
    if not calibrate_seeds:
        raise UserError(f"{path}: no fallback threshold stored for {wanted}; give one or seeds to calibrate on")
    refuse_a_silent_gate(path, payload["name"], policy, cfg)  # a gate calibrated now must be able to fire
    values = nominal_scores(policy, calibrate_seeds, cfg.signal, env_kwargs, cfg.variance)
    value = calibrate_threshold(values, cfg.quantile)
    refuse_a_flat_threshold(path, values, value, cfg)
    log.info(
        "fallback threshold %.4g (q=%.3f of %d nominal steps on seeds %s)",
        value,
        cfg.quantile,
        len(values),
        list(calibrate_seeds),
    )
    return value, f"calibrated on seeds {list(calibrate_seeds)} ({len(values)} nominal steps)"


def fallback_for_command(cfg: Any, path: str | Path) -> tuple[FallbackConfig | None, float | None, str]:
    """The fallback of `drive eval` / `drive drive` from their shared options (fallback, fallback_threshold,
    calibrate_seeds, samples, seed, env, max_episode_steps): (config, threshold, origin), or (None, None, "off")."""
    fb = parse_fallback(cfg.fallback)
    if fb is None:
        return None, None, "off"
    threshold, origin = resolve_threshold(
        path,
        fb,
        cfg.fallback_threshold,
        parse_seeds(cfg.calibrate_seeds),
        cfg.samples,
        cfg.seed,
        {"name": cfg.env, "max_episode_steps": cfg.max_episode_steps},
    )
    return fb, threshold, origin


def store_threshold(
    path: str | Path,
    cfg: FallbackConfig,
    calibrate_seeds: Sequence[int],
    samples: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
) -> float:
    """Calibrate on nominal laps and write the threshold into the checkpoint's extra["fallback"] (atomically), so
    `drive eval --fallback` and `drive drive --fallback` use it without driving the nominal laps again."""
    env_kwargs = dict(env_kwargs or {})
    payload = checkpoint.read(path, kind="controller")
    policy = controller_policy(path, samples, 0, shadow=None, env=env_kwargs.get("name", "carracing"))
    refuse_a_silent_gate(path, payload["name"], policy, cfg)
    values = nominal_scores(policy, calibrate_seeds, cfg.signal, env_kwargs, cfg.variance)
    value = calibrate_threshold(values, cfg.quantile)
    refuse_a_flat_threshold(path, values, value, cfg)
    fallback = {
        "threshold": value,
        "signal": cfg.signal,
        "quantile": cfg.quantile,
        "n_samples": policy.samples,
        "variance": cfg.variance,
        "seeds": list(map(int, calibrate_seeds)),
        "n_steps": int(len(values)),
    }
    checkpoint.resave(payload, policy.model, path, {"fallback": fallback})
    return value


def refuse_a_silent_gate(path: str | Path, name: str, policy: ControllerPolicy, cfg: FallbackConfig) -> None:
    """A UserError, before any lap is driven, for a gate that could never fire: its score is exactly 0 on a grey
    frame, as it is on every frame when the controller's samples cannot disagree (GMLE: one deterministic network;
    any stochastic method at --samples 1). Its calibrated threshold would be 0 and the gate would never engage."""
    prediction, _, _ = policy.predict(np.full(RAW_SHAPE, 128, np.uint8))
    policy.reset()  # the probe leaves no frame in the stack and no draw in the generator behind
    if score(prediction_variance(prediction, cfg.variance), cfg.signal) > 0.0:
        return
    default = int(getattr(policy.model, "default_samples", 1))
    if cfg.variance == "epistemic" and policy.samples == 1 and default > 1:
        raise UserError(
            f"{path}: with --samples 1 controller {name}'s samples cannot disagree, so its epistemic "
            f"variance is 0 and an epistemic gate could never fire: give --samples 2 or more (its own: "
            f"{default})"
        )
    if cfg.variance == "epistemic":
        raise UserError(
            f"{path}: controller {name} has no epistemic variance (its samples never disagree), so an "
            "epistemic gate could never fire: calibrate on its total variance instead (--variance total; "
            "drive eval --fallback expert:variance=total reads it) or use a controller with epistemic "
            "variance (nsac, mcd, de, der, sdenet)"
        )
    raise UserError(
        f"{path}: controller {name}'s {cfg.variance} variance of {cfg.signal} is 0, so the gate could "
        "never fire: choose another --signal"
    )


def refuse_a_flat_threshold(path: str | Path, values: np.ndarray, value: float, cfg: FallbackConfig) -> None:
    """A UserError instead of storing a threshold that calibrates nothing: every nominal step scored the same (the
    gate could not tell an unusual step from a usual one), or the quantile is 0 (no threshold at all)."""
    finite = values[np.isfinite(values)]
    what = f"{cfg.variance} variance of {cfg.signal}"
    if np.ptp(finite) == 0.0:
        raise UserError(
            f"{path}: all {len(finite)} nominal steps scored the same {what} ({finite[0]:.4g}), so no "
            "threshold separates an unusual step from a usual one; no gate (choose another "
            "--signal or --variance)"
        )
    if value <= 0.0:
        raise UserError(
            f"{path}: the q={cfg.quantile} quantile of the {what} on {len(finite)} nominal steps is 0 "
            f"({int((finite <= 0).sum())} scored 0), which is no threshold and no gate (choose a "
            "higher --quantile or another --signal)"
        )
