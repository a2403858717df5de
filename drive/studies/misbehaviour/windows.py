"""The misbehaviour protocol's settings and its windows: how an episode's per-step score becomes the window
aggregates, the steps left out and the lead-time horizons that drive/studies/misbehaviour/protocol.py thresholds and
scores. The rules, their sources in the field's code and our departures from it are stated there."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

FPS = 50  # gymnasium/envs/box2d/car_racing.py: FPS = 50, one step per frame
AGGREGATES = ("max", "mean")
THRESHOLD_FITS = ("gamma", "quantile")
SCORINGS = ("alike", "field")
THRESHOLD_SPLITS = ("halves", "in_sample")
POOLINGS = ("families", "episodes")


@dataclass(frozen=True)
class Episode:
    scores: np.ndarray
    """(T,) the monitor's score per step, higher = more alarming"""
    onsets: Sequence[int] = ()
    """misbehaviour onset steps: a shifted run's are scored (TP / FN); a nominal run's only mark windows left out"""
    nominal: bool = False
    """a nominal run (no shift): its windows count FP / TN, its own misbehaviours are never TP / FN"""
    busy: np.ndarray | None = field(default=None, repr=False)
    """(T,) bool, steps inside a misbehaviour; None: only the onset steps"""
    family: str = ""
    """a shifted run's shift family: pooled over several, each family weighs the same (ProtocolConfig.pooling);
    ignored on nominal runs"""

    def __post_init__(self) -> None:
        scores = np.asarray(self.scores, np.float64)
        if scores.ndim != 1 or not np.isfinite(scores).all():
            raise ValueError(f"Episode.scores must be a finite 1-D array, got shape {scores.shape}")
        onsets = tuple(sorted({int(o) for o in self.onsets}))
        if onsets and not 0 <= onsets[0] <= onsets[-1] < len(scores):
            raise ValueError(f"Episode.onsets {onsets} fall outside the episode's {len(scores)} steps")
        busy = np.zeros(len(scores), bool) if self.busy is None else np.asarray(self.busy, bool)
        if busy.shape != scores.shape:
            raise ValueError(f"Episode.busy has shape {busy.shape}, the scores {scores.shape}")
        busy = busy.copy()
        busy[list(onsets)] = True
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "onsets", onsets)
        object.__setattr__(self, "busy", busy)


@dataclass(frozen=True)
class ProtocolConfig:
    fps: int = FPS
    """steps per second; the window is fps frames (1 s)"""
    aggregate: str = "max"
    """how a window's frames become one score: max (the field's runs) or mean"""
    threshold_fit: str = "gamma"
    """gamma (the field) or quantile (empirical, method 'higher')"""
    scoring: Literal["alike", "field"] = "alike"
    """alike: nominal and misbehaviour windows from the same score; field: nominal windows on a trailing mean over
    fps frames, misbehaviour windows on the raw score, as in the field's code"""
    smooth: bool = False
    """scoring alike: both sides' scores pass the same trailing mean over fps frames before windowing"""
    threshold_split: Literal["halves", "in_sample"] = "halves"
    """halves: thresholds fitted on one half of the nominal episodes count the other half's false positives;
    in_sample: fitted and counted on the same nominal episodes, as the field does"""
    warmup_s: float = 1.0
    """the first seconds of every episode are not scored (CarRacing zooms in over its first second)"""
    overlap_tolerance: int = 2
    """a window holding more labelled frames than this is not scorable (the field: 2)"""
    lead_horizon_s: float = 3.0
    """the lead time looks this far back before each onset (s); a nominal run's windows in it are left out"""
    pooling: Literal["families", "episodes"] = "families"
    """how shifted runs of several families are pooled: families (each family's runs weigh the same in total, the
    bootstrap resamples within each family) or episodes (every run weighs 1, one stratum: a family with more
    misbehaving runs weighs more); with one family the two are the same"""

    def __post_init__(self) -> None:
        if self.aggregate not in AGGREGATES or self.threshold_fit not in THRESHOLD_FITS or self.fps < 1:
            raise ValueError(f"ProtocolConfig: aggregate in {AGGREGATES}, threshold_fit in {THRESHOLD_FITS}, fps >= 1")
        if self.scoring not in SCORINGS or self.threshold_split not in THRESHOLD_SPLITS or self.warmup_s < 0:
            raise ValueError(
                f"ProtocolConfig: scoring in {SCORINGS}, threshold_split in {THRESHOLD_SPLITS}, warmup_s >= 0"
            )
        if self.pooling not in POOLINGS:
            raise ValueError(f"ProtocolConfig: pooling in {POOLINGS}, got {self.pooling!r}")
        if self.smooth and self.scoring == "field":
            raise ValueError("ProtocolConfig: smooth is for scoring 'alike'; 'field' smooths the nominal side only")

    @property
    def warmup_steps(self) -> int:
        return int(round(self.warmup_s * self.fps))


DEFAULTS = ProtocolConfig()
# the field's rules; their code scores one simulation at a time, so pooling is ours: there every episode weighs 1
FIELD = ProtocolConfig(scoring="field", threshold_split="in_sample", warmup_s=0.0, pooling="episodes")


def aggregate(windows: np.ndarray, how: str) -> np.ndarray:  # (K, W) -> (K,)
    return windows.max(1) if how == "max" else windows.mean(1)


def trailing_mean(scores: np.ndarray, w: int) -> np.ndarray:
    """(T,) mean of the last w scores, fewer at the start: pandas rolling(w, min_periods=1).mean()."""
    csum = np.concatenate([[0.0], np.cumsum(scores)])
    t = np.arange(1, len(scores) + 1)
    return (csum[t] - csum[np.maximum(t - w, 0)]) / np.minimum(t, w)


def series(ep: Episode, cfg: ProtocolConfig) -> np.ndarray:
    """(T,) the score a window of `ep` is cut from: smoothed (restarting at the warm-up's end, so the transient does
    not leak in) on both sides with scoring alike and smooth, on the nominal side only with scoring field."""
    if not (cfg.smooth if cfg.scoring == "alike" else ep.nominal):
        return ep.scores
    start, out = cfg.warmup_steps, ep.scores.copy()
    out[start:] = trailing_mean(ep.scores[start:], cfg.fps)
    return out


def left_out(ep: Episode, cfg: ProtocolConfig) -> np.ndarray:
    """(T,) bool, the steps of a nominal run a nominal window may not hold: its own misbehaviours (busy) and the lead
    horizon before each onset (a window there may be a true alarm)."""
    assert ep.busy is not None
    mask, h = ep.busy.copy(), int(round(cfg.lead_horizon_s * cfg.fps))
    for o in ep.onsets:
        mask[max(0, o - h) : o] = True
    return mask


def nominal_windows(ep: Episode, cfg: ProtocolConfig) -> tuple[np.ndarray, int]:
    """(K,) aggregates of a nominal episode's scored windows: consecutive fps-frame windows from the warm-up's end,
    the partial tail dropped, less those holding more than overlap_tolerance `left_out` steps; and how many those
    were."""
    w, start = cfg.fps, cfg.warmup_steps
    scores = series(ep, cfg)[start:]
    k = len(scores) // w
    held = left_out(ep, cfg)[start : start + k * w].reshape(k, w).sum(1)
    keep = held <= cfg.overlap_tolerance
    return aggregate(scores[: k * w].reshape(k, w)[keep], cfg.aggregate), int((~keep).sum())


def misbehaviour_windows(ep: Episode, ttm: int, cfg: ProtocolConfig) -> tuple[np.ndarray, int, int, int]:
    """(M,) aggregates of the scorable misbehaviour windows at `ttm` s, and the counts before_start, overlap, merged."""
    assert ep.busy is not None
    w, labelled, scores = cfg.fps, ep.busy.copy(), series(ep, cfg)
    out: list[float] = []
    before_start = overlap = merged = 0
    for o in ep.onsets:
        if o > 0 and ep.busy[o - 1]:
            merged += 1
            continue
        start, end = o - ttm * w, o - (ttm - 1) * w  # window [start, end)
        if start < cfg.warmup_steps:
            before_start += 1
        elif labelled[start : end + 1].sum() > cfg.overlap_tolerance:  # the field's .loc[start:end] holds both ends
            overlap += 1
        else:
            labelled[start : end + 1] = True
            out.append(float(aggregate(scores[None, start:end], cfg.aggregate)[0]))
    return np.asarray(out), before_start, overlap, merged


def lead_horizons(ep: Episode, cfg: ProtocolConfig) -> list[tuple[int, np.ndarray]]:
    """Per (non-merged) misbehaviour: (the lead of the horizon's first step in steps, (n,) running max of the score
    over the horizon [max(o - H, warm-up end), o), busy steps at -inf). The first crossing of t is a searchsorted on
    the running max."""
    assert ep.busy is not None
    h, out, scores = int(round(cfg.lead_horizon_s * cfg.fps)), [], series(ep, cfg)
    for o in ep.onsets:
        if o > 0 and ep.busy[o - 1]:
            continue
        start = min(o, max(cfg.warmup_steps, o - h))
        window = np.where(ep.busy[start:o], -np.inf, scores[start:o])
        out.append((o - start, np.maximum.accumulate(window) if len(window) else window))
    return out


def lead_steps(horizons: Iterable[tuple[int, np.ndarray]], threshold: float) -> list[tuple[int, int]]:
    """Per misbehaviour whose score reaches `threshold` in its horizon: (its index in `horizons`, the steps from the
    first crossing to onset)."""
    return [
        (k, lead - int(np.searchsorted(run, threshold)))
        for k, (lead, run) in enumerate(horizons)
        if len(run) and run[-1] >= threshold
    ]
