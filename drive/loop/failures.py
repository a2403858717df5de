"""Failure events in closed loop and how well each uncertainty signal predicts them (`drive eval`).

Events, from the privileged state after each step (the state a controller never sees):
- `off_track`: no wheel touches a road tile (state `off_track`), onset at every on -> off transition — the same
  transitions `EpisodeResult.off_track_events` counts;
- `spin`: the car points more than 90 degrees away from the centreline direction (|heading_error| > pi/2), onset
  when it crosses; re-armed once |heading_error| < pi/4;
- `stall`: speed below 1 m/s for 20 consecutive steps after the first 50 (the start from rest), onset at the first
  slow step of that run; re-armed above 3 m/s.
A step "in" an event (off the track, spun round, stalled) is `busy`. Onset t means the state after step t's action.

Signals, per step from the controller's `StepPrediction`: epistemic, aleatoric and total variance of the steering
and the epistemic variance summed over the three actions (the fallback gate's `steer` and `sum` scores).

`failure_report` pools the steps of all episodes that are not busy and asks, per signal:
- AUROC of "an event begins within the next H steps" (onset in [t, t + H)), from the signal at step t;
- lead time: the signal crosses its calibrated threshold (a high quantile of its value on nominal laps, as the
  fallback gate is calibrated) in a run of alarm steps that is still on within H steps before the onset; the lead is
  the onset minus the start of that run. Median over detected events, the share detected, and false alarms per
  lap (alarm runs with no onset during them or within H steps after).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from drive import metrics
from drive.loop.rollout import StepPrediction, StepRecord

SIGNALS = ("epistemic_steer", "aleatoric_steer", "total_steer", "epistemic_sum")
EVENTS = ("off_track", "spin", "stall")


def signals_of(pred: StepPrediction) -> np.ndarray:
    """(len(SIGNALS),) the uncertainty signals of one step."""
    epi, ale = np.asarray(pred.epistemic_var, np.float64), np.asarray(pred.aleatoric_var, np.float64)
    return np.array([epi[0], ale[0], epi[0] + ale[0], epi.sum()])


@dataclass(frozen=True)
class EventRules:
    spin_heading: float = math.pi / 2
    """spin: |heading error| above this (rad)"""
    spin_rearm: float = math.pi / 4
    """a spin ends (the next can begin) below this |heading error| (rad)"""
    stall_speed: float = 1.0
    """stall: speed below this (m/s) ..."""
    stall_steps: int = 20
    """... for this many consecutive steps"""
    stall_after: int = 50
    """stalls are not counted in the first steps (the start from rest)"""
    stall_rearm: float = 3.0
    """a stall ends above this speed (m/s)"""


class FailureMonitor:
    """Observer: per episode, the signals of every step, the events and the busy steps (`episode()`)."""

    def __init__(self, heading_index: int | None, rules: EventRules = EventRules()):
        self.heading_index, self.rules = heading_index, rules
        self.reset()

    def reset(self) -> None:
        self.signals: list[np.ndarray] = []
        self.busy: list[bool] = []
        self.events: list[dict[str, Any]] = []
        self._off = self._spun = self._stalled = False
        self._slow = 0

    def __call__(self, record: StepRecord) -> None:
        if record.t == 0:
            self.reset()
        pred = record.output.prediction
        self.signals.append(signals_of(pred) if pred is not None else np.full(len(SIGNALS), np.nan))
        self.busy.append(self._off or self._spun or self._stalled)
        self._update(record.t, record.next_info)

    def _update(self, t: int, info: Mapping[str, Any]) -> None:
        r = self.rules
        off = bool(info.get("off_track", False))
        if off and not self._off:
            self.events.append({"kind": "off_track", "t": t})
        self._off = off
        if self.heading_index is not None and "state" in info:
            heading = abs(float(info["state"][self.heading_index]))
            if not self._spun and heading > r.spin_heading:
                self.events.append({"kind": "spin", "t": t})
                self._spun = True
            elif self._spun and heading < r.spin_rearm:
                self._spun = False
        speed = float(info.get("speed", np.inf))
        self._slow = self._slow + 1 if speed < r.stall_speed and t >= r.stall_after else 0
        if not self._stalled and self._slow >= r.stall_steps:
            self.events.append({"kind": "stall", "t": t - r.stall_steps + 1})
            self._stalled = True
        elif self._stalled and speed > r.stall_rearm:
            self._stalled = False

    def episode_traces(self) -> dict[str, Any]:
        """What the episode's record carries: events (kind, onset step), signals (T, len(SIGNALS)), busy (T,)."""
        return {
            "events": list(self.events),
            "signals": np.asarray(self.signals, np.float32).reshape(-1, len(SIGNALS)),
            "busy": np.asarray(self.busy, bool),
        }


def _labels(n: int, onsets: Sequence[int], horizon: int) -> np.ndarray:
    y = np.zeros(n, bool)
    for tau in onsets:
        y[max(0, tau - horizon + 1) : tau + 1] = True
    return y


def _runs(alarm: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of every run of consecutive alarm steps."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], alarm.astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def _lead_times(alarm: np.ndarray, onsets: Sequence[int], horizon: int) -> tuple[list[int], int, int]:
    """(leads of detected events, missed events, false-alarm runs) of one episode."""
    runs = _runs(alarm)
    leads, missed, used = [], 0, set()
    for tau in onsets:
        hits = [i for i, (s, e) in enumerate(runs) if s <= tau and e > tau - horizon]
        if hits:
            leads.append(tau - runs[hits[-1]][0])
            used.add(hits[-1])
        else:
            missed += 1
    false = sum(1 for i, (s, e) in enumerate(runs) if i not in used and not any(s <= t < e + horizon for t in onsets))
    return leads, missed, false


def failure_report(
    episodes: Sequence[Mapping[str, Any]], thresholds: Mapping[str, float] | None, horizon: int = 25
) -> dict[str, Any]:
    """Per signal: AUROC of an event within `horizon` steps, and with `thresholds` the lead times (see module)."""
    counts = {kind: sum(1 for ep in episodes for e in ep["events"] if e["kind"] == kind) for kind in EVENTS}
    out: dict[str, Any] = {"horizon": horizon, "n_episodes": len(episodes), "events": counts, "signals": {}}
    scores, labels = [], []
    for ep in episodes:
        sig, busy = np.asarray(ep["signals"]), np.asarray(ep["busy"])
        y = _labels(len(sig), [e["t"] for e in ep["events"]], horizon)
        keep = ~busy & np.isfinite(sig).all(1)
        scores.append(sig[keep])
        labels.append(y[keep])
    s, y = np.concatenate(scores), np.concatenate(labels)
    out["n_steps"], out["n_positive"] = int(len(y)), int(y.sum())
    for j, name in enumerate(SIGNALS):
        row: dict[str, Any] = {"auroc": metrics.auroc(s[~y, j], s[y, j]) if 0 < y.sum() < len(y) else None}
        if thresholds is not None and name in thresholds:
            leads: list[int] = []
            missed = false = 0
            for ep in episodes:
                alarm = np.asarray(ep["signals"])[:, j] > thresholds[name]
                got = _lead_times(alarm, [e["t"] for e in ep["events"]], horizon)
                leads, missed, false = leads + got[0], missed + got[1], false + got[2]
            n_events = len(leads) + missed
            row.update(
                threshold=float(thresholds[name]),
                median_lead_steps=float(np.median(leads)) if leads else None,
                detected=len(leads),
                n_events=n_events,
                false_alarms_per_lap=false / max(len(episodes), 1),
            )
        out["signals"][name] = row
    return out


def nominal_thresholds(signals: np.ndarray, quantile: float) -> dict[str, float]:
    """Each signal's `quantile` over the steps of nominal laps (T, len(SIGNALS))."""
    signals = np.asarray(signals, np.float64)
    return {name: float(np.nanquantile(signals[:, j], quantile)) for j, name in enumerate(SIGNALS)}


def split_traces(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Take the per-step traces (signals, busy) out of eval records (they stay out of the JSON); keeps the events."""
    out = []
    for r in records:
        out.append(
            {
                "events": r.get("events", []),
                "signals": r.pop("signals", np.zeros((0, len(SIGNALS)))),
                "busy": r.pop("busy", np.zeros(0, bool)),
            }
        )
    return out
