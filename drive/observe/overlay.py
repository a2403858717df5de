"""The uncertainty overlay drawn on a driving frame — one function used by both `drive replay` and `drive drive`.

`draw_overlay(frame, state)` upscales the frame and adds a side panel:
- steering: the predicted mean with its +-2 sigma band (sigma from the total predictive variance, aleatoric +
  epistemic) on a [-1, 1] axis, and the shadow expert's steering as a green marker;
- aleatoric and epistemic variance bars for steer, gas and brake on a log axis (1e-8 .. 1: epistemic variances
  of 1e-6 are as readable as aleatoric ones of 1e-2), the fallback threshold a red tick on the gated action's
  epistemic bar, the score's ratio to the threshold printed beside it, and a legend;
- kappa, phi, psi gauges (NSAC's mean-reversion rate, long-term mean and noise, summarised over heads and key
  pairs; absent for controllers without them);
- the fallback state (controller in charge, or expert / slow-down engaged) and step, speed, gas, brake.

`OverlayState` is built from a recorded trace row (`from_row`, replay) or from a live step (`from_step`, `drive
drive`), so the two paths draw exactly the same picture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from drive.loop.rollout import StepRecord
from drive.observe import FRAME_SIZE
from sim_bridges.carracing.bridge import ACTION_NAMES as ACTIONS

PANEL_WIDTH = 300
# variance bars: log10 axis from 1e-8 (below: empty bar) to 1 (steering/gas/brake live in [-1, 1] / [0, 1])
LOG_VAR_RANGE = (-8.0, 0.0)

WHITE = (255, 255, 255)
GREY = (140, 140, 140)
DARK = (30, 30, 30)
GREEN = (60, 220, 60)
RED = (230, 50, 50)
ORANGE = (250, 160, 30)
BLUE = (80, 150, 255)
PURPLE = (190, 100, 240)


@dataclass(frozen=True)
class OverlayState:
    mean: tuple[float, float, float]
    """predicted action mean (steer, gas, brake)"""
    aleatoric_var: tuple[float, float, float]
    epistemic_var: tuple[float, float, float]
    expert: tuple[float, float, float] | None = None
    """the shadow expert's action on the same state"""
    kappa: float | None = None
    phi: float | None = None
    psi: float | None = None
    fallback: str = "off"
    """off (no gate), controller (gate armed, not engaged), expert or slow (engaged)"""
    fallback_score: float | None = None
    fallback_threshold: float | None = None
    fallback_signal: str = "steer"
    t: int = 0
    speed: float | None = None
    executed: tuple[float, float, float] | None = None

    @classmethod
    def from_step(cls, record: StepRecord) -> OverlayState:
        """From one live step of a frame controller (its PolicyOutput)."""
        out = record.output
        if out.prediction is None:
            raise ValueError("the overlay draws a controller's prediction; this policy reports none")
        values = out.internals.values if out.internals is not None else {}

        def triple(x: Any) -> tuple[float, float, float] | None:
            return None if x is None else tuple(float(v) for v in np.asarray(x).reshape(-1)[:3])  # type: ignore[return-value]

        def gauge(name: str) -> float | None:
            return float(np.mean(values[name])) if name in values else None

        gate = out.gate
        return cls(
            mean=triple(out.prediction.mean),
            aleatoric_var=triple(out.prediction.aleatoric_var),  # type: ignore[arg-type]
            epistemic_var=triple(out.prediction.epistemic_var),
            expert=triple(out.expert),  # type: ignore[arg-type]
            kappa=gauge("kappa"),
            phi=gauge("phi"),
            psi=gauge("psi"),
            fallback="off" if gate is None else gate.state,
            fallback_score=None if gate is None else gate.score,
            fallback_threshold=None if gate is None else gate.threshold,
            fallback_signal="steer" if gate is None else gate.signal,
            t=record.t,
            speed=float(record.info.get("speed", np.nan)),
            executed=triple(record.action),
        )

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> OverlayState:
        """From one trace row (drive/observe/trace.py names the columns)."""

        def triple(prefix: str) -> tuple[float, float, float] | None:
            keys = [f"{prefix}_{a}" for a in ACTIONS]
            if not all(k in row and row[k] is not None for k in keys):
                return None
            return tuple(float(row[k]) for k in keys)

        def scalar(key: str) -> float | None:
            value = row.get(key)
            return None if value is None or not np.isfinite(value) else float(value)

        return cls(
            mean=triple("mean"),
            aleatoric_var=triple("aleatoric_var"),
            epistemic_var=triple("epistemic_var"),
            expert=triple("expert"),
            kappa=scalar("kappa"),
            phi=scalar("phi"),
            psi=scalar("psi"),
            fallback=str(row.get("fallback", "off")),
            fallback_score=scalar("fallback_score"),
            fallback_threshold=scalar("fallback_threshold"),
            fallback_signal=str(row.get("fallback_signal", "steer")),
            t=int(row.get("t", 0)),
            speed=scalar("speed"),
            executed=triple("action"),
        )


def _text(img: np.ndarray, text: str, org: tuple[int, int], color=WHITE, scale: float = 0.45) -> None:
    cv2.putText(img, text, org, cv2.FONT_HERSHEY_SIMPLEX, scale, color, 1, cv2.LINE_AA)


def _to_x(value: float, x0: int, x1: int, lo: float, hi: float) -> int:
    frac = (np.clip(value, lo, hi) - lo) / (hi - lo)
    return int(round(x0 + frac * (x1 - x0)))


def _steering(panel: np.ndarray, s: OverlayState, y: int) -> int:
    x0, x1 = 20, PANEL_WIDTH - 20
    _text(panel, "steering  mean +-2 sigma", (x0, y))
    y += 22
    mean, total_std = s.mean[0], float(np.sqrt(s.aleatoric_var[0] + s.epistemic_var[0]))
    band_lo, band_hi = _to_x(mean - 2 * total_std, x0, x1, -1, 1), _to_x(mean + 2 * total_std, x0, x1, -1, 1)
    cv2.rectangle(panel, (band_lo, y - 8), (band_hi, y + 8), BLUE, -1)
    cv2.line(panel, (x0, y), (x1, y), GREY, 1)
    cv2.line(panel, ((x0 + x1) // 2, y - 12), ((x0 + x1) // 2, y + 12), GREY, 1)
    xm = _to_x(mean, x0, x1, -1, 1)
    cv2.line(panel, (xm, y - 12), (xm, y + 12), WHITE, 2)
    if s.expert is not None:
        xe = _to_x(s.expert[0], x0, x1, -1, 1)
        cv2.fillPoly(panel, [np.array([[xe, y + 10], [xe - 6, y + 20], [xe + 6, y + 20]], np.int32)], GREEN)
    _text(panel, "-1", (x0 - 4, y + 30), GREY, 0.35)
    _text(panel, "+1", (x1 - 10, y + 30), GREY, 0.35)
    label = f"{mean:+.2f} +-{2 * total_std:.2f}"
    if s.expert is not None:
        label += f"   expert {s.expert[0]:+.2f}"
    _text(panel, label, (x0 + 40, y + 30), WHITE, 0.38)
    y += 44  # legend
    cv2.line(panel, (x0, y - 4), (x0, y + 4), WHITE, 2)
    _text(panel, "mean", (x0 + 5, y + 3), GREY, 0.33)
    cv2.rectangle(panel, (x0 + 45, y - 4), (x0 + 55, y + 4), BLUE, -1)
    _text(panel, "+-2 sigma (total)", (x0 + 58, y + 3), GREY, 0.33)
    cv2.fillPoly(panel, [np.array([[x0 + 170, y - 4], [x0 + 165, y + 4], [x0 + 175, y + 4]], np.int32)], GREEN)
    _text(panel, "shadow expert", (x0 + 179, y + 3), GREY, 0.33)
    return y + 22


def _log_x(var: float, x0: int, x1: int) -> int:
    lo, hi = LOG_VAR_RANGE
    return _to_x(np.log10(max(var, 10.0**lo)), x0, x1, lo, hi)


def _std_bars(panel: np.ndarray, s: OverlayState, y: int) -> int:
    x0, x1 = 70, PANEL_WIDTH - 20
    _text(panel, "variance (log10)", (20, y))
    cv2.rectangle(panel, (150, y - 7), (157, y), ORANGE, -1)
    _text(panel, "aleatoric", (160, y), GREY, 0.33)
    cv2.rectangle(panel, (215, y - 7), (222, y), PURPLE, -1)
    _text(panel, "epistemic", (225, y), GREY, 0.33)
    y += 14
    lo, hi = LOG_VAR_RANGE
    for decade in range(int(lo), int(hi) + 1, 2):  # the axis: a tick and label every other decade
        xd = _to_x(decade, x0, x1, lo, hi)
        cv2.line(panel, (xd, y - 2), (xd, y + 2), GREY, 1)
        _text(panel, f"{decade}", (xd - 6, y + 12), GREY, 0.3)
    y += 18
    for i, name in enumerate(ACTIONS):
        _text(panel, name, (20, y + 12), GREY, 0.4)
        for j, (var, color) in enumerate(((s.aleatoric_var[i], ORANGE), (s.epistemic_var[i], PURPLE))):
            yy = y + j * 10
            cv2.rectangle(panel, (x0, yy), (x1, yy + 7), DARK, -1)
            cv2.rectangle(panel, (x0, yy), (_log_x(float(var), x0, x1), yy + 7), color, -1)
            is_gated = s.fallback_signal in (name, "sum") and j == 1
            if is_gated and s.fallback_threshold is not None:
                xt = _log_x(s.fallback_threshold, x0, x1)
                cv2.line(panel, (xt, yy - 3), (xt, yy + 10), RED, 2)
        label = f"{s.aleatoric_var[i]:.1e} / {s.epistemic_var[i]:.1e}"
        if s.fallback_signal == name and s.fallback_threshold and s.fallback_score is not None:
            label += f"  ({s.fallback_score / s.fallback_threshold:.2f}x thr)"
        _text(panel, label, (x0, y + 30), GREY, 0.33)
        y += 38
    if s.fallback_threshold is not None:
        cv2.line(panel, (20, y), (28, y), RED, 2)
        _text(panel, f"fallback threshold {s.fallback_threshold:.1e} ({s.fallback_signal})", (34, y + 4), GREY, 0.33)
        y += 12
    return y + 4


def _gauges(panel: np.ndarray, s: OverlayState, y: int) -> int:
    if s.kappa is None and s.phi is None and s.psi is None:
        _text(panel, "no kappa/phi/psi (not NSAC)", (20, y), GREY, 0.4)
        return y + 20
    _text(panel, "NSAC gates (mean over heads)", (20, y))
    _text(panel, "arc: v/(1+v), phi: (phi+1)/2", (20, y + 13), GREY, 0.3)
    y += 8
    y += 10
    centres = (60, PANEL_WIDTH // 2, PANEL_WIDTH - 60)
    # kappa, psi > 0: the arc shows v / (1 + v); phi in (-1, 1): (phi + 1) / 2
    specs = (("kappa", s.kappa, None), ("phi", s.phi, (-1.0, 1.0)), ("psi", s.psi, None))
    for cx, (name, value, bounds) in zip(centres, specs, strict=True):
        cy, r = y + 36, 28
        cv2.ellipse(panel, (cx, cy), (r, r), 0, 180, 360, DARK, 6)
        if value is not None:
            frac = (value - bounds[0]) / (bounds[1] - bounds[0]) if bounds else value / (1.0 + value)
            frac = float(np.clip(frac, 0.0, 1.0))
            cv2.ellipse(panel, (cx, cy), (r, r), 0, 180, 180 + 180 * frac, GREEN, 6)
            _text(panel, f"{value:.3g}", (cx - 18, cy + 4), WHITE, 0.38)
        _text(panel, name, (cx - 14, cy + 22), GREY, 0.4)
    return y + 62


def _fallback(panel: np.ndarray, s: OverlayState, y: int) -> int:
    colors = {"off": GREY, "controller": GREEN, "expert": RED, "slow": ORANGE}
    labels = {
        "off": "fallback off",
        "controller": "controller driving",
        "expert": "FALLBACK: expert drives",
        "slow": "FALLBACK: slowing down",
    }
    color = colors.get(s.fallback, GREY)
    cv2.rectangle(panel, (20, y), (PANEL_WIDTH - 20, y + 24), color, 2 if s.fallback in ("off", "controller") else -1)
    _text(panel, labels.get(s.fallback, s.fallback), (28, y + 17), WHITE, 0.45)
    y += 40
    if s.fallback_score is not None and s.fallback_threshold is not None:
        _text(panel, f"score {s.fallback_score:.2e}  threshold {s.fallback_threshold:.2e}", (20, y), GREY, 0.36)
        y += 16
    return y


def draw_overlay(frame: np.ndarray, state: OverlayState, frame_size: int = FRAME_SIZE) -> np.ndarray:
    """The frame (H, W, 3) RGB uint8 or (H, W) gray, upscaled to frame_size, beside the uncertainty panel.

    Returns (frame_size, frame_size + PANEL_WIDTH, 3) uint8 RGB.
    """
    frame = np.asarray(frame)
    if frame.ndim == 2:
        frame = np.repeat(frame[:, :, None], 3, axis=2)
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"overlay needs an (H, W, 3) or (H, W) frame, got shape {frame.shape}")
    big = cv2.resize(frame.astype(np.uint8), (frame_size, frame_size), interpolation=cv2.INTER_NEAREST)
    panel = np.full((frame_size, PANEL_WIDTH, 3), 12, dtype=np.uint8)
    y = 22
    y = _steering(panel, state, y)
    y = _std_bars(panel, state, y)
    y = _gauges(panel, state, y)
    y = _fallback(panel, state, y)
    info = f"t {state.t}"
    if state.speed is not None:
        info += f"   speed {state.speed:.1f}"
    if state.executed is not None:
        info += f"   gas {state.executed[1]:.2f} brake {state.executed[2]:.2f}"
    _text(panel, info, (20, min(y + 4, frame_size - 8)), GREY, 0.36)
    return np.concatenate([big, panel], axis=1)
