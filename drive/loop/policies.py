"""Closed-loop policies: experts acting from the privileged state, DART noise, and trained controllers.

- `ExpertPolicy`: an expert (reset(), act(state) -> (3,)) as a policy; it acts from info["state"], never pixels.
- `NoisyPolicy`: DART noise injection (executes label + N(0, std^2), clipped; the label stays the clean action).
- `ControllerPolicy`: a trained controller. Each step codes the raw frame once with the `ObservationCoder` its
  training data used (datasets/frames.py), runs one `predict(x, S)` call (NSAC runs its encoder once and samples
  only its attention head; DER answers in closed form), takes the predictive mean as the action (clipped to the
  action space), and reports the `StepPrediction`, the controller's `Internals`, the latency, the shadow expert's
  action and the fallback gate's state in its `PolicyOutput`.
- The shadow expert acts on info["state"] every step, on the controller's own states, without driving: the
  on-policy label that measures calibration in closed loop (coverage of its steering by the controller's
  intervals, NLL of its action) and the driver a fallback hands over to.
- `episode_summary()` (after each episode; `drive eval` merges it into the episode's record): coverage50/90 of the
  expert's steering, NLL of the expert's action, latency p50/p95, mean epistemic variance, fallback interventions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np
import torch

from agents.encoders import FrameTokens
from datasets.frames import ObservationCoder
from drive.devices import resolve
from drive.loop import lanes
from drive.loop.fallback import FallbackGate
from drive.loop.rollout import GateStep, Internals, PolicyOutput, StepPrediction, clip_action
from drive.metrics import gaussian_nll_elementwise
from sim_bridges.carracing.bridge import ACTION_HIGH, ACTION_LOW

log = logging.getLogger(__name__)

Z50, Z90 = NormalDist().inv_cdf(0.75), NormalDist().inv_cdf(0.95)


class ExpertPolicy:
    """An expert (reset(), act(state) -> (3,)) as a closed-loop policy: it acts from info["state"], not pixels."""

    needs_pixels = False

    def __init__(self, expert: Any, name: str = "expert"):
        self.expert = expert
        self.name = name

    def reset(self, seed: int | None = None) -> None:
        self.expert.reset()

    @property
    def lane_expert(self) -> Any:
        """The expert `act_lanes` asks for this lane's action (with the other lanes', in one call)."""
        return self.expert

    def act(self, obs: Any, info: Mapping[str, Any]) -> np.ndarray:
        if "state" not in info:
            raise KeyError("ExpertPolicy needs info['state'] (privileged state) from the env")
        return np.asarray(self.expert.act(info["state"]), np.float32)


class NoisyPolicy:
    """DART noise injection: executes label + N(0, std^2), clipped; the label stays the clean action.

    The noise stream is seeded per episode from (track seed, noise_seed), so a rerun of the same episode executes the
    same actions (what makes a resumed collection identical to an uninterrupted one).
    """

    def __init__(self, policy: Any, std: float, low: np.ndarray, high: np.ndarray, noise_seed: int = 0):
        if std < 0:
            raise ValueError(f"action noise std must be >= 0, got {std}")
        self.policy, self.std, self.noise_seed = policy, float(std), int(noise_seed)
        self.low, self.high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        self.needs_pixels = getattr(policy, "needs_pixels", True)
        self._rng = np.random.default_rng(self.noise_seed)

    def reset(self, seed: int | None = None) -> None:
        self.policy.reset(seed=seed)
        self._rng = np.random.default_rng([self.noise_seed, 0 if seed is None else int(seed)])

    @property
    def lane_inner(self) -> Any:
        return self.policy

    def act(self, obs: Any, info: Mapping[str, Any]) -> PolicyOutput:
        return self.wrap(self.policy.act(obs, info))

    def wrap(self, out: np.ndarray | PolicyOutput) -> PolicyOutput:
        """The inner policy's step -> this one's (noise added to the executed action)."""
        clean = clip_action(
            np.asarray(out.action if isinstance(out, PolicyOutput) else out, np.float32), self.low, self.high
        )
        noise = self.std * self._rng.standard_normal(clean.shape).astype(np.float32) if self.std else 0.0
        executed = clip_action(clean + noise, self.low, self.high)
        if not isinstance(out, PolicyOutput):  # an expert's bare action (collect's every step): nothing else to keep
            return PolicyOutput(executed, clean)
        return PolicyOutput(
            executed, clean, out.source, out.prediction, out.internals, out.expert, out.latency_ms, out.gate, out.frame
        )


class ControllerPolicy:
    """A trained controller on raw CarRacing frames; optional shadow expert and uncertainty-gated fallback."""

    needs_pixels = True

    def __init__(
        self,
        model: torch.nn.Module,
        coder: ObservationCoder,
        samples: int | None = None,
        seed: int = 0,
        shadow: Any = None,
        gate: FallbackGate | None = None,
        name: str = "controller",
        threads: int | None = 1,
        device: str | torch.device = "cpu",
    ):
        """threads: torch CPU threads for this process (None leaves them). A batch-1 step gains nothing from more
        than one, and on a loaded machine a second thread's spin-waits turned ~1 ms steps into ~100 ms (measured).
        device: where the controller runs (drive/devices.py); frames are coded on the host and moved per call."""
        if threads is not None:
            torch.set_num_threads(threads)
        if gate is not None and gate.cfg.mode == "expert" and shadow is None:
            raise ValueError("fallback mode 'expert' needs a shadow expert (it hands control to it)")
        self.device = resolve(device)
        self.model, self.coder = model.eval().to(self.device), coder
        for module in model.modules():  # each frame's token computed once, not k times (agents/encoders.py)
            if isinstance(module, FrameTokens):
                module.remember_frames(True)
        self.samples = int(samples or int(getattr(model, "default_samples", 1)))
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        self.seed, self.shadow, self.gate, self.name = int(seed), shadow, gate, name
        self.generator = torch.Generator(self.device).manual_seed(self.seed)
        self.stats = OnPolicyStats()

    def reset(self, seed: int | None = None) -> None:
        # sampling replays exactly per (policy seed, track seed), whatever ran before
        self.generator.manual_seed(self.seed * 1_000_003 + (0 if seed is None else int(seed)))
        for part in (self.shadow, self.gate, self.stats, self.coder):
            if part is not None:
                part.reset()

    def episode_summary(self) -> dict[str, Any]:
        """The finished episode's on-policy calibration, latency and fallback figures."""
        out = self.stats.summary()
        if self.gate is not None:
            out.update(self.gate.summary())
        return out

    def predict(self, frame: np.ndarray) -> tuple[StepPrediction, Internals | None, float]:
        """One raw (96, 96, 3) frame -> the step's prediction (3,) each, the internals, the latency in ms.
        Looked up on the module at call time, so `drive bench closedloop`'s stage timer sees one car's calls too."""
        return lanes.predict_lanes([self], [frame])[0]

    def act(self, obs: np.ndarray, info: Mapping[str, Any]) -> PolicyOutput:
        return self.decide(*self.predict(obs), info)

    def decide(
        self,
        pred: StepPrediction,
        internals: Internals | None,
        latency_ms: float,
        info: Mapping[str, Any],
        expert: np.ndarray | None = None,
    ) -> PolicyOutput:
        """The step after the controller call: the action, the shadow expert, the on-policy stats, the gate.
        expert: the shadow expert's action on this step when already computed (`act_lanes` batches the lanes')."""
        action = clip_action(np.asarray(pred.mean), ACTION_LOW, ACTION_HIGH).astype(np.float32)
        if self.shadow is not None and expert is None:
            if "state" not in info:
                raise KeyError("the shadow expert needs info['state'] (privileged state) from the env")
            expert = np.asarray(self.shadow.act(info["state"]), np.float32)
        self.stats.add(pred, latency_ms, expert)
        source, executed, gate = "policy", action, None
        if self.gate is not None:
            value = self.gate.score_of(pred)
            engaged = self.gate.update(value)
            executed = self.gate.apply(action, expert)
            if engaged:
                source = "expert" if self.gate.cfg.mode == "expert" else "slow"
            gate = GateStep(source if engaged else "controller", value, self.gate.threshold, self.gate.cfg.signal)
        return PolicyOutput(executed, action, source, pred, internals, expert, latency_ms, gate, self.coder.last_frame)


class OnPolicyStats:
    """Per-episode on-policy calibration and latency, accumulated from the steps a ControllerPolicy takes."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._mean: list[np.ndarray] = []
        self._var: list[np.ndarray] = []
        self._epi: list[np.ndarray] = []
        self._expert: list[np.ndarray] = []
        self._latency: list[float] = []

    def add(self, pred: StepPrediction, latency_ms: float, expert: np.ndarray | None) -> None:
        self._mean.append(pred.mean)
        self._var.append(pred.total_var)
        self._epi.append(pred.epistemic_var)
        self._latency.append(latency_ms)
        if expert is not None:
            self._expert.append(expert)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if not self._mean:
            return out
        lat = np.asarray(self._latency)
        epi = np.asarray(self._epi)  # (T, 3)
        out.update(
            latency_ms_p50=float(np.percentile(lat, 50)),
            latency_ms_p95=float(np.percentile(lat, 95)),
            epistemic_var_steer=float(epi[:, 0].mean()),
        )
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
    nll = gaussian_nll_elementwise(mean, var, expert)  # (T, 3)
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
    for key in (
        "coverage50_steer",
        "coverage90_steer",
        "nll_expert",
        "nll_expert_steer",
        "mae_expert_steer",
        "epistemic_var_steer",
        "fallback_fraction",
    ):
        values = [(r[key], w) for r, w in zip(records, steps, strict=True) if key in r]
        if values:
            v, w = np.array(values).T
            out[key] = float(np.sum(v * w) / np.sum(w))
    for key in ("latency_ms_p50", "latency_ms_p95"):
        lat = [r[key] for r in records if key in r]
        if lat:
            out[key] = float(np.median(lat))
    if any("n_interventions" in r for r in records):
        out["n_interventions"] = int(sum(r.get("n_interventions", 0) for r in records))
    return out
