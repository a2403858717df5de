"""Closed-loop policy adapters for trained controllers: `ckpt:PATH` in `drive eval`, `drive drive` and the recorder.

- `ControllerPolicy`: a trained controller acting on the frame stack. Each step runs one `moments(x, S)` call (the
  controller samples S times; NSAC runs its encoder once and samples only its attention head), takes the predictive
  mean as the action (clipped to the action space), and hands observers everything it computed through
  `PolicyOutput.extras`: predicted mean, aleatoric and epistemic variance per action, the controller's internals
  (NSAC: kappa, phi, psi, logit mean/variance, attention weights), the step latency, the shadow expert's action and
  the fallback state.
- The shadow expert acts on `info["state"]` every step, on the controller's own states, without driving: it is the
  on-policy label that measures calibration in closed loop (coverage of its steering by the controller's intervals,
  NLL of its action) and the driver the fallback hands over to.
- `OnPolicyStats`: an observer turning those extras into per-episode summaries (coverage50/90 of the expert's
  steering, NLL of the expert's action, latency p50/p95, mean epistemic variance, fallback interventions).
- `calibrate_fallback`: the fallback threshold from nominal laps (the controller driving alone on tracks that are
  not evaluated).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

from agents.base import total_variance
from drive.fallback import FallbackConfig, FallbackGate, calibrate_threshold, score
from drive.rollout import PolicyOutput, StepRecord, make_env, rollout

log = logging.getLogger(__name__)

ACTION_LOW = np.array([-1.0, 0.0, 0.0], dtype=np.float32)
ACTION_HIGH = np.array([1.0, 1.0, 1.0], dtype=np.float32)
Z50, Z90 = float(stats.norm.ppf(0.75)), float(stats.norm.ppf(0.95))


class ControllerPolicy:
    """A trained controller on the (k, 84, 84) frame stack; optional shadow expert and uncertainty-gated fallback."""

    needs_pixels = True

    def __init__(
        self,
        model: torch.nn.Module,
        n_samples: int | None = None,
        seed: int = 0,
        shadow: Any = None,
        fallback: FallbackGate | None = None,
        name: str = "controller",
    ):
        if fallback is not None and fallback.cfg.mode == "expert" and shadow is None:
            raise ValueError("fallback mode 'expert' needs a shadow expert (it hands control to it)")
        self.model = model.eval()
        self.n_samples = int(n_samples or getattr(model, "default_samples", 1))
        if self.n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {self.n_samples}")
        self.seed = int(seed)
        self.shadow = shadow
        self.fallback = fallback
        self.name = name
        self.generator = torch.Generator().manual_seed(self.seed)

    def reset(self, seed: int | None = None) -> None:
        # sampling replays exactly per (policy seed, track seed), whatever ran before
        self.generator.manual_seed(self.seed * 1_000_003 + (0 if seed is None else int(seed)))
        if self.shadow is not None:
            self.shadow.reset()
        if self.fallback is not None:
            self.fallback.reset()

    @torch.inference_mode()
    def predict(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray], float]:
        """(mean, aleatoric_var, epistemic_var) each (3,), the model's internals, and the latency in ms."""
        x = torch.as_tensor(np.asarray(obs))[None]  # (1, k, 84, 84)
        t0 = time.perf_counter()
        mu, var = self.model.moments(x, self.n_samples, self.generator)  # (S, 1, D) each
        pred = total_variance(mu, var)
        latency_ms = (time.perf_counter() - t0) * 1e3
        internals = {k: v.detach().cpu().numpy() for k, v in self.model.internals().items()}
        return pred.mean[0].numpy(), pred.aleatoric_var[0].numpy(), pred.epistemic_var[0].numpy(), internals, latency_ms

    def act(self, obs: np.ndarray, info: Mapping[str, Any]) -> PolicyOutput:
        mean, ale, epi, internals, latency_ms = self.predict(obs)
        action = np.clip(mean, ACTION_LOW, ACTION_HIGH).astype(np.float32)
        expert = None
        if self.shadow is not None:
            if "state" not in info:
                raise KeyError("the shadow expert needs info['state'] (privileged state) from the env")
            expert = np.asarray(self.shadow.act(info["state"]), np.float32)
        extras: dict[str, Any] = {
            "mean": mean,
            "aleatoric_var": ale,
            "epistemic_var": epi,
            "internals": internals,
            "latency_ms": latency_ms,
            "expert": expert,
            "fallback": "off",
        }
        source, executed = "policy", action
        if self.fallback is not None:
            value = score(epi, self.fallback.cfg.signal)
            engaged = self.fallback.update(value)
            executed = self.fallback.apply(action, expert)
            if engaged:
                source = "expert" if self.fallback.cfg.mode == "expert" else "slow"
            extras.update(
                fallback=source if engaged else "controller",
                fallback_score=value,
                fallback_threshold=self.fallback.threshold,
                fallback_signal=self.fallback.cfg.signal,
            )
        return PolicyOutput(executed, label=action, source=source, extras=extras)


class OnPolicyStats:
    """Observer: per-episode on-policy calibration and latency from a ControllerPolicy's extras."""

    def __init__(self, policy: ControllerPolicy | None = None):
        self.policy = policy
        self.episodes: dict[int, dict[str, Any]] = {}
        self._reset()

    def _reset(self) -> None:
        self._mean, self._var, self._expert, self._latency, self._epi = [], [], [], [], []

    def __call__(self, record: StepRecord) -> None:
        extras = record.extras
        if "mean" in extras:
            self._mean.append(extras["mean"])
            self._var.append(np.asarray(extras["aleatoric_var"]) + np.asarray(extras["epistemic_var"]))
            self._epi.append(extras["epistemic_var"])
            self._latency.append(extras["latency_ms"])
            if extras.get("expert") is not None:
                self._expert.append(extras["expert"])
        if record.done:
            self.episodes[record.seed] = self._summary()
            self._reset()

    def _summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self._mean:
            lat = np.asarray(self._latency)
            epi = np.asarray(self._epi)  # (T, 3)
            out.update(latency_ms_p50=float(np.percentile(lat, 50)), latency_ms_p95=float(np.percentile(lat, 95)),
                       epistemic_var_steer=float(epi[:, 0].mean()))  # fmt: skip
        if self._expert and len(self._expert) == len(self._mean):
            out.update(expert_agreement(np.asarray(self._mean), np.asarray(self._var), np.asarray(self._expert)))
        if self.policy is not None and self.policy.fallback is not None:
            out.update(self.policy.fallback.summary())
        return out


def expert_agreement(mean: np.ndarray, var: np.ndarray, expert: np.ndarray) -> dict[str, float]:
    """Coverage of the expert's steering by the 50 % / 90 % central intervals of N(mean, var), NLL of its action.

    mean, var, expert: (T, 3). NLL is the mean over steps and actions (per element, as drive.metrics.gaussian_nll);
    nll_expert_steer over steps only.
    """
    sd = np.sqrt(np.maximum(var, 1e-12))
    err = np.abs(expert - mean)
    nll = 0.5 * np.log(2 * np.pi * sd**2) + err**2 / (2 * sd**2)  # (T, 3)
    return {
        "coverage50_steer": float(np.mean(err[:, 0] <= Z50 * sd[:, 0])),
        "coverage90_steer": float(np.mean(err[:, 0] <= Z90 * sd[:, 0])),
        "nll_expert": float(nll.mean()),
        "nll_expert_steer": float(nll[:, 0].mean()),
        "mae_expert_steer": float(err[:, 0].mean()),
    }


def aggregate(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Across episodes: step-weighted coverage and NLL, latency percentiles as the median of per-episode values."""
    out: dict[str, float] = {}
    steps = np.array([r.get("steps", 1) for r in records], dtype=np.float64)
    for key in ("coverage50_steer", "coverage90_steer", "nll_expert", "nll_expert_steer", "mae_expert_steer",
                "epistemic_var_steer", "fallback_fraction"):  # fmt: skip
        values = [(r[key], w) for r, w in zip(records, steps, strict=True) if key in r]
        if values:
            v, w = np.array(values).T
            out[key] = float(np.sum(v * w) / np.sum(w))
    for key in ("latency_ms_p50", "latency_ms_p95"):
        values = [r[key] for r in records if key in r]
        if values:
            out[key] = float(np.median(values))
    if any("n_interventions" in r for r in records):
        out["n_interventions"] = int(sum(r.get("n_interventions", 0) for r in records))
    return out


# -- building from a spec --------------------------------------------------------------------------------------------
def load_controller_policy(
    path: str | Path,
    n_samples: int | None = None,
    seed: int = 0,
    shadow: str | None = "ppo",
    fallback: FallbackConfig | None = None,
    threshold: float | None = None,
) -> ControllerPolicy:
    """A checkpoint as a policy. With `fallback`, `threshold` must be given (see `calibrate_fallback`)."""
    from drive.checkpoint import load_controller

    model, payload = load_controller(path)
    encoder = payload["config"].get("encoder", {})
    if encoder.get("kind") != "frames":
        raise ValueError(f"{path}: controller encoder is {encoder.get('kind')!r}; CarRacing needs kind 'frames'")
    if payload["config"].get("out_dim") != 3:
        raise ValueError(f"{path}: controller predicts {payload['config'].get('out_dim')} outputs, CarRacing needs 3")
    expert = None
    if shadow:
        from drive.experts import load_expert

        expert = load_expert(shadow)
    gate = None
    if fallback is not None:
        if threshold is None:
            raise ValueError("a fallback needs a threshold: calibrate it with calibrate_fallback on nominal laps")
        gate = FallbackGate(threshold, fallback)
    return ControllerPolicy(model, n_samples, seed, expert, gate, name=f"{payload['name']}:{Path(path).name}")


def nominal_scores(
    policy: ControllerPolicy, seeds: Sequence[int], signal: str, env_kwargs: Mapping[str, Any]
) -> np.ndarray:
    """Per-step gate scores of the controller driving alone (no fallback) on `seeds`."""
    if policy.fallback is not None:
        raise ValueError("nominal laps run without a fallback")
    scores: list[float] = []
    env = make_env(**env_kwargs)
    try:
        rollout(env, policy, seeds=seeds, on_step=lambda r: scores.append(score(r.extras["epistemic_var"], signal)))
    finally:
        env.close()
    return np.asarray(scores)


def calibrate_fallback(
    path: str | Path,
    seeds: Sequence[int],
    cfg: FallbackConfig,
    n_samples: int | None = None,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
) -> float:
    """The threshold: the `cfg.quantile` quantile of the controller's score on nominal laps over `seeds`."""
    policy = load_controller_policy(path, n_samples, seed, shadow=None)
    values = nominal_scores(policy, seeds, cfg.signal, env_kwargs or {})
    threshold = calibrate_threshold(values, cfg.quantile)
    log.info("fallback threshold %.4g (q=%.3f of %d nominal steps on seeds %s)", threshold, cfg.quantile,
             len(values), list(seeds))  # fmt: skip
    return threshold
