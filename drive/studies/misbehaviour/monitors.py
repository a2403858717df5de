"""The field's black-box monitors watching a closed-loop run: SelfOracle and ThirdEye scores for every step.

`MonitorFactory(ckpt, selforacle, thirdeye)` is an `ObserverFactory` of `drive.loop.evaluate` (picklable, built in
each worker): each lane gets a `MonitorRecorder`, which keeps the coded frame the controller saw at every step
(`PolicyOutput.frame`, the newest frame of its stack) and, when the episode ends (`episode_traces`), scores them all
in batches — the same numbers a per-step monitor would give, at a fraction of the cost:

- `selforacle`: the reconstruction error of SelfOracle's VAE (agents/monitors/selforacle.py; `drive monitor train`);
- `thirdeye_avg`, `thirdeye_avg_grad`: the mean of the controller's Grad-CAM map of its steering on the newest frame
  and its change from the previous step (agents/monitors/thirdeye.py), the stack rebuilt as the controller's
  `ObservationCoder` built it (the first frame repeated k - 1 times after reset).

Scores are aligned with the controller's own signals (drive/loop/failures.py `FailureMonitor`): index t is the step
whose frame the controller acted on at t.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from drive.loop.rollout import StepRecord

BATCH = 64  # frames per monitor forward


@dataclass(frozen=True)
class MonitorFactory:
    """Builds one `MonitorRecorder` per lane (drive.loop.evaluate `ObserverFactory`)."""

    ckpt: str
    """the controller's checkpoint (ThirdEye reads its attention)"""
    selforacle: str | None = None
    """a `drive monitor train` checkpoint, or None (no SelfOracle scores)"""
    thirdeye: bool = True

    def names(self) -> tuple[str, ...]:
        return (("selforacle",) if self.selforacle else ()) + (
            ("thirdeye_avg", "thirdeye_avg_grad") if self.thirdeye else ()
        )

    def __call__(self, env: Any, spec: str) -> MonitorRecorder:
        return MonitorRecorder(self, _models(self.ckpt, self.selforacle, self.thirdeye))


_MODELS: dict[tuple, tuple] = {}  # per worker process: the monitors' models, loaded once and shared by its lanes


def _models(ckpt: str, selforacle: str | None, thirdeye: bool) -> tuple[Any, Any, int]:
    key = (ckpt, selforacle, thirdeye)
    if key not in _MODELS:
        from drive.checkpoint import load_controller, load_monitor

        vae = load_monitor(selforacle)[0] if selforacle else None
        controller, payload = load_controller(ckpt) if thirdeye else (None, {})
        if thirdeye and str(payload.get("data", {}).get("input", "frames")) != "frames":
            raise ValueError(
                f"{ckpt}: ThirdEye rebuilds the controller's input from its coded frames; this one "
                f"transforms them ({payload['data']['input']!r})"
            )
        k = int(payload.get("config", {}).get("encoder", {}).get("n_tokens", 4))
        _MODELS.clear()
        _MODELS[key] = (vae, controller, k)
    return _MODELS[key]


class MonitorRecorder:
    """Observer of one lane: the controller's coded frames of the episode, scored at its end."""

    def __init__(self, factory: MonitorFactory, models: tuple[Any, Any, int]):
        self.factory, (self.vae, self.controller, self.k) = factory, models
        self.frames: list[np.ndarray] = []

    def __call__(self, record: StepRecord) -> None:
        if record.t == 0:
            self.frames = []
        frame = record.output.frame
        if frame is None:
            raise ValueError("the monitors need the controller's coded frame (PolicyOutput.frame): a ckpt: policy")
        self.frames.append(np.asarray(frame, np.uint8))

    def episode_traces(self) -> Mapping[str, Any]:
        """{"monitor_scores": (T, M) float32, "monitor_names": the M names}; the frames are dropped."""
        frames = torch.as_tensor(np.stack(self.frames)) if self.frames else torch.zeros((0, 84, 84), dtype=torch.uint8)
        self.frames = []
        columns = []
        if self.vae is not None:
            columns.append(torch.cat([self.vae.score(b) for b in frames.split(BATCH)]).numpy())
        if self.controller is not None:
            from agents.monitors.thirdeye import gradcam, thirdeye_scores

            stacks = _stacks(frames, self.k)  # (T, k, 84, 84)
            maps = torch.cat([gradcam(self.controller, b) for b in stacks.split(BATCH)]) if len(stacks) else stacks
            summary = thirdeye_scores(maps.reshape(len(frames), -1))
            columns += [summary["avg"], summary["avg_grad"]]
        scores = np.stack(columns, 1).astype(np.float32) if columns else np.zeros((len(frames), 0), np.float32)
        return {"monitor_scores": scores, "monitor_names": list(self.factory.names())}


def _stacks(frames: torch.Tensor, k: int) -> torch.Tensor:
    """(T, 84, 84) -> (T, k, 84, 84): each step's stack, the first frame repeated k - 1 times (as after reset)."""
    padded = torch.cat([frames[:1].expand(k - 1, *frames.shape[1:]), frames]) if len(frames) else frames
    return padded.unfold(0, k, 1).permute(0, 3, 1, 2).contiguous() if len(frames) else padded.reshape(0, k, 84, 84)
