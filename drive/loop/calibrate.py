"""Calibrate a CarRacing controller's aleatoric temperature in closed loop, on nominal laps, against its shadow expert.

Offline calibration fits the expert's states; a clone in closed loop visits its own, where the expert it is scored
against (the shadow expert, acting on privileged state) disagrees more than on the recorded frames. So the fit
uses the quantity the evaluation reports: the controller drives alone (no fallback) on track seeds apart from
training and evaluation seeds, with its temperature reset to 1, and per action dimension a factor T on its
predicted noise std is chosen so that its 90 % interval covers 90 % of the shadow expert's actions there
(`drive.calibration.fit_aleatoric_temperature`, the split-conformal choice on a set of steps). T only rescales the
aleatoric part, so the actions, the epistemic variance and any fallback threshold stored in the file stay valid.

Rule (`rule`): steps within a lap are not exchangeable across laps — one lap where the clone leaves the road gives
hundreds of steps on which the expert's action has nothing to do with the clone's. `lap-median` (default) fits T on
each lap and takes the median over laps; `pooled` fits once on all steps (the textbook split-conformal set).
Measured on the shipped NSAC (checkpoints/carracing_nsac.md has the commands): its nominal laps 2000-2004 are all
clean and the rules agree — lap-median T steer 1.194, pooled 1.175 (`drive calibrate --ckpt runs/ref/ship01/best.pt
--rule pooled --out runs/ref/ship01/pooled.pt`); the coverage90 of the shadow expert's steering on 1000-1019 is 0.890
and 0.889 (raw, T = 1: 0.875 on the fit laps). They part when a lap leaves the road: an earlier model (its data cannot
be regenerated, so no figure is kept) had one off-road fit lap whose own T was several times the others', and the
pooled fit over-covered every other lap. The acceptance band is 0.85-0.95.
`store_temperature` writes T into the checkpoint (state_dict buffer `aleatoric_temperature`) and what was done into
extra["calibration"].
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from drive import calibration, checkpoint
from drive.errors import UserError
from drive.loop.envs import make_env
from drive.loop.policies import ControllerPolicy, expert_agreement
from drive.loop.rollout import StepRecord, rollout
from drive.loop.specs import controller_policy

log = logging.getLogger(__name__)


def nominal_predictions(
    policy: ControllerPolicy, seeds: Sequence[int], env_kwargs: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """Per-step mean, aleatoric and epistemic variance (T, D) of the controller driving alone, and the shadow
    expert's action (T, D) on the same states."""
    if policy.shadow is None or policy.gate is not None:
        raise ValueError("nominal laps need a shadow expert and no fallback")
    rows: dict[str, list[Any]] = {"mean": [], "aleatoric": [], "epistemic": [], "expert": [], "seed": []}

    def observe(record: StepRecord) -> None:
        pred, expert = record.output.prediction, record.output.expert
        assert pred is not None and expert is not None
        rows["mean"].append(pred.mean)
        rows["aleatoric"].append(pred.aleatoric_var)
        rows["epistemic"].append(pred.epistemic_var)
        rows["expert"].append(expert)
        rows["seed"].append(record.seed)

    env = make_env(**env_kwargs)
    try:
        rollout(env, policy, seeds=seeds, on_step=observe)
    finally:
        env.close()
    return {k: np.asarray(v, dtype=np.int64 if k == "seed" else np.float64) for k, v in rows.items()}


def fit_on_laps(laps: Mapping[str, np.ndarray], coverage: float, rule: str = "lap-median") -> tuple[torch.Tensor, dict]:
    """T (D,) from `nominal_predictions`' arrays by `rule` (module docstring), and each lap's own T by seed."""
    keys = ("mean", "aleatoric", "epistemic", "expert")

    def fit(mask: np.ndarray) -> torch.Tensor:
        mean, ale, epi, expert = (laps[k][mask] for k in keys)
        return calibration.fit_aleatoric_temperature(mean, ale, epi, expert, coverage)

    per_lap = {int(s): fit(laps["seed"] == s) for s in np.unique(laps["seed"])}
    if rule == "pooled":
        t = fit(np.ones(len(laps["seed"]), dtype=bool))
    elif rule == "lap-median":
        no_lap = torch.full(laps["mean"].shape[1:], torch.inf)
        t = torch.stack(list(per_lap.values())).median(0).values if per_lap else no_lap
    else:
        raise ValueError(f"unknown rule {rule!r}: lap-median or pooled")
    return t, {str(s): [float(v) for v in x] for s, x in per_lap.items()}


def store_temperature(
    path: str | Path,
    seeds: Sequence[int],
    shadow: str,
    coverage: float = 0.9,
    samples: int | None = None,
    out: str | Path | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    rule: str = "lap-median",
) -> dict[str, Any]:
    """Fit T on nominal laps over `seeds` (temperature reset to 1 first: refitting is idempotent) and write the
    checkpoint to `out` (default: in place, atomically). Returns what extra["calibration"] records."""
    env_kwargs = dict(env_kwargs or {"name": "carracing"})
    payload = checkpoint.read(path, kind="controller")
    policy = controller_policy(path, samples, 0, shadow=shadow, env=env_kwargs.get("name", "carracing"))
    model = policy.model
    model.set_aleatoric_temperature(torch.ones(()))  # type: ignore[operator]
    laps = nominal_predictions(policy, seeds, env_kwargs)
    temperature, per_lap = fit_on_laps(laps, coverage, rule)
    if not bool(torch.isfinite(temperature).all()):
        raise UserError(f"{len(laps['mean'])} nominal steps are too few to fit a {coverage:.0%} interval per lap")
    # as stored (float32), a hair wide: the k-th case sits exactly on its interval's edge and must stay inside
    temperature = (temperature.float() * (1 + 1e-5)).clamp_min(1e-3)
    before = expert_agreement(laps["mean"], laps["aleatoric"] + laps["epistemic"], laps["expert"])
    t2 = temperature.double().numpy() ** 2
    after = expert_agreement(laps["mean"], t2 * laps["aleatoric"] + laps["epistemic"], laps["expert"])
    model.set_aleatoric_temperature(temperature)  # type: ignore[operator]
    record = {
        "temperature": [float(t) for t in temperature],
        "coverage": coverage,
        "rule": rule,
        "per_lap": per_lap,
        "seeds": list(map(int, seeds)),
        "n_steps": int(len(laps["mean"])),
        "shadow": shadow,
        "n_samples": policy.samples,
        "fitted_on": "nominal laps in closed loop, shadow expert's actions",
        "coverage90_steer_before": before["coverage90_steer"],
        "coverage90_steer_after": after["coverage90_steer"],
        "nll_expert_steer_before": before["nll_expert_steer"],
        "nll_expert_steer_after": after["nll_expert_steer"],
    }
    checkpoint.resave(payload, model, out or path, {"calibration": record})
    log.info(
        "aleatoric temperature %s from %d nominal steps on seeds %s",
        record["temperature"],
        record["n_steps"],
        list(seeds),
    )
    return record
