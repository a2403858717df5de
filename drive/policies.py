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
- `episode_summary()` (after each episode; `drive eval` merges it into the episode's record): coverage50/90 of the
  expert's steering, NLL of the expert's action, latency p50/p95, mean epistemic variance, fallback interventions.
The fallback's threshold comes from drive/fallback.py (`resolve_threshold`: given, stored, or calibrated on nominal
laps); `drive eval` of a trained controller (`evaluate_controller`, `describe`) lives in drive/evaluate.py.
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
from drive.fallback import FallbackConfig, FallbackGate, score
from drive.rollout import PolicyOutput

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
        threads: int | None = 1,
        coder: Any = None,
    ):
        """threads: torch CPU threads for this process (None leaves them). A batch-1 step gains nothing from more
        than one, and on a loaded machine a second thread's spin-waits turned ~1 ms steps into ~100 ms (measured)."""
        if threads is not None:
            torch.set_num_threads(threads)
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
        self.stats = OnPolicyStats()
        #: rebuilds the observation the controller was trained on (drive/tasks/demos.py ObservationCoder)
        self.coder = coder
        self.needs_raw = bool(getattr(coder, "needs_raw", False))

    def reset(self, seed: int | None = None) -> None:
        # sampling replays exactly per (policy seed, track seed), whatever ran before
        self.generator.manual_seed(self.seed * 1_000_003 + (0 if seed is None else int(seed)))
        if self.shadow is not None:
            self.shadow.reset()
        if self.fallback is not None:
            self.fallback.reset()
        self.stats.reset()
        if self.coder is not None:
            self.coder.reset()

    def episode_summary(self) -> dict[str, Any]:
        """The finished episode's on-policy calibration, latency and fallback figures."""
        out = self.stats.summary()
        if self.fallback is not None:
            out.update(self.fallback.summary())
        return out

    @torch.inference_mode()
    def predict(self, obs: np.ndarray, info: Mapping[str, Any] | None = None):
        """(mean, aleatoric_var, epistemic_var) each (3,), the model's internals, and the latency in ms."""
        t0 = time.perf_counter()
        if self.coder is not None:
            x = self.coder(obs, info or {})  # (1, k, 84, 84)
        else:
            x = torch.as_tensor(np.asarray(obs))[None]  # (1, k, 84, 84)
        mu, var = self.model.moments(x, self.n_samples, self.generator)  # (S, 1, D) each
        pred = total_variance(mu, var)
        latency_ms = (time.perf_counter() - t0) * 1e3
        internals = {k: v.detach().cpu().numpy() for k, v in self.model.internals().items()}
        return pred.mean[0].numpy(), pred.aleatoric_var[0].numpy(), pred.epistemic_var[0].numpy(), internals, latency_ms

    def act(self, obs: np.ndarray, info: Mapping[str, Any]) -> PolicyOutput:
        mean, ale, epi, internals, latency_ms = self.predict(obs, info)
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
        self.stats.add(mean, ale, epi, latency_ms, expert)
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
    """Per-episode on-policy calibration and latency, accumulated from the steps a ControllerPolicy takes."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self._mean, self._var, self._expert, self._latency, self._epi = [], [], [], [], []

    def add(self, mean, ale, epi, latency_ms: float, expert) -> None:
        self._mean.append(mean)
        self._var.append(np.asarray(ale) + np.asarray(epi))
        self._epi.append(epi)
        self._latency.append(latency_ms)
        if expert is not None:
            self._expert.append(expert)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if not self._mean:
            return out
        lat = np.asarray(self._latency)
        epi = np.asarray(self._epi)  # (T, 3)
        out.update(latency_ms_p50=float(np.percentile(lat, 50)), latency_ms_p95=float(np.percentile(lat, 95)),
                   epistemic_var_steer=float(epi[:, 0].mean()))  # fmt: skip
        if len(self._expert) == len(self._mean):
            out.update(expert_agreement(np.asarray(self._mean), np.asarray(self._var), np.asarray(self._expert)))
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
def load_shadow(name: str | None, env: str = "carracing") -> Any:
    """The shadow expert (reset(), act(state)) by name: ppo, pursuit, an expert checkpoint path; None for none."""
    if not name:
        return None
    from drive.rollout import load_expert_policy

    return load_expert_policy(name, env).expert


def load_controller_policy(
    path: str | Path,
    n_samples: int | None = None,
    seed: int = 0,
    shadow: str | None = "ppo",
    fallback: FallbackConfig | None = None,
    threshold: float | None = None,
    env: str = "carracing",
) -> ControllerPolicy:
    """A checkpoint as a policy. With `fallback`, `threshold` must be given (see `resolve_threshold`)."""
    from drive.checkpoint import load_controller

    model, payload = load_controller(path)
    encoder = payload["config"].get("encoder", {})
    if encoder.get("kind") != "frames":
        raise ValueError(f"{path}: controller encoder is {encoder.get('kind')!r}; CarRacing needs kind 'frames'")
    if payload["config"].get("out_dim") != 3:
        raise ValueError(f"{path}: controller predicts {payload['config'].get('out_dim')} outputs, CarRacing needs 3")
    gate = None
    if fallback is not None:
        if threshold is None:
            raise ValueError("a fallback needs a threshold: calibrate it on nominal laps (resolve_threshold)")
        gate = FallbackGate(threshold, fallback)
    from drive.tasks.demos import ObservationCoder

    coder = ObservationCoder.from_fingerprint(payload.get("data", {}), encoder.get("n_tokens", 4))
    expert = load_shadow(shadow, env)
    name = f"{payload['name']}:{Path(path).name}"
    return ControllerPolicy(model, n_samples, seed, expert, gate, name=name, coder=coder)


# -- `drive eval --policy ckpt:PATH` ---------------------------------------------------------------------------------
def default_shadow(shadow: str | None, env: str, path: str | None = None) -> str | None:
    """None -> the expert that labelled the checkpoint's training demonstrations (recorded in its data fingerprint),
    else the env's reference expert (ppo on CarRacing, pursuit on the fake road); 'none' or '' -> no shadow.

    The shadow must be the labelling expert: on-policy calibration asks whether the controller's intervals cover the
    action it was taught to imitate. (The PPO expert's steering chatters between the locks while pursuit's is smooth,
    so a controller cloned from pursuit covers PPO's steering almost never, however well it drives.)"""
    if shadow is None:
        if path is not None and env == "carracing":
            from drive.checkpoint import read

            expert = read(path, kind="controller").get("data", {}).get("expert")
            if isinstance(expert, str) and expert in ("ppo", "pursuit"):
                return expert
        return "pursuit" if env == "fake-road" else "ppo"
    return None if shadow.lower() in ("", "none", "off") else shadow


def ckpt_policy(
    path: str,
    env: str = "carracing",
    samples: int | None = None,
    shadow: str | None = None,
    fallback: str = "off",
    fallback_threshold: float | None = None,
    seed: int = 0,
) -> ControllerPolicy:
    """The `ckpt:PATH` builder of drive/evaluate.py (runs in eval workers, so options are primitives)."""
    gate_cfg = None if fallback == "off" else FallbackConfig(mode=fallback)
    shadow = default_shadow(shadow, env, path)
    return load_controller_policy(path, samples, seed, shadow, gate_cfg, fallback_threshold, env)
