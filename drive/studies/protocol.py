"""Misbehaviour prediction scored as the field scores it: nominal thresholds, TTM windows, F3, bootstrap intervals.

The protocol of Stocco et al. (SelfOracle, ICSE 2020; ThirdEye, ASE 2022) as used by Grewal, Tonella & Stocco,
"Predicting Safety Misbehaviours in Autonomous Driving Systems using Uncertainty Quantification" (ICST 2024). Every
rule below was read from their public code, ast-fortiss-tum/misbehaviour-prediction-with-uncertainty-quantification:
`compute_fp_and_tn`, `compute_tp_and_fn` and `get_threshold` in scripts/evaluate_failure_prediction_heatmaps_scores.py
(ThirdEye), scripts/evaluate_failure_prediction_selforacle.py (SelfOracle) and evaluate_models_dynamic_fps.py (MC
dropout, deep ensembles), which share the same three functions.

Input: per episode a per-step score (T,) (higher = more alarming), the misbehaviour onset steps, a nominal/shifted
flag and optionally a busy mask (T,) of steps inside a misbehaviour (default: only the onset steps).

- Window length W = fps frames (1 s): CarRacing runs at FPS = 50 steps/s (gymnasium car_racing.py), so W = 50.
- Nominal windows: per nominal episode, the score smoothed by a trailing moving average over W frames (pandas
  rolling(W, min_periods=1).mean(), their `sma_nominal`), cut into consecutive windows [kW, (k+1)W), the partial
  tail dropped; each window's aggregate (max, as in all their `*_compute_all.py` runs; mean available) is one
  nominal window. `smooth_nominal=False` scores nominal windows on the raw score like the misbehaviour windows
  (their code smooths only the nominal side).
- Threshold: fitted on the nominal WINDOW aggregates (their `get_threshold(list_aggregated, ...)`), not on frames,
  so a confidence level is a per-window false-alarm rate. Gamma: zeros removed, scipy.stats.gamma.fit(floc=0),
  t = ppf(level); the field uses it for every monitor (SelfOracle's reconstruction error, ThirdEye's attention
  scores, MC dropout / ensemble variances), and so do we by default. `quantile`: the empirical quantile (numpy
  method "higher", an observed value), the way our fallback gate is calibrated; reported as a check.
  Levels {0.95, 0.99, 0.999, 0.9999, 0.99999} (their cfg.CONFIDENCE_LEVEL; output folders t95 ... t99999).
- Misbehaviour window at time to misbehaviour TTM s, onset o: frames [o - TTM W, o - (TTM - 1) W), i.e. the W
  frames that START TTM s before the onset and end TTM - 1 s before it. At 50 steps/s: TTM 1 -> [o-50, o),
  TTM 2 -> [o-100, o-50), TTM 3 -> [o-150, o-100). TP if aggregate >= t, else FN; nominal FP if aggregate > t,
  else TN (their code's > and >=, kept).
- Not scorable ("undetectable" in their code), counted and reported, in neither TP nor FN: a window that would
  start before step 0 (`before_start`); a window whose frames [o - TTM W, o - (TTM-1) W] (both ends, their .loc)
  hold more than 2 labelled frames (`overlap`), labelled = busy steps plus the windows of earlier scorable
  misbehaviours of that episode at that TTM (their code relabels each accepted window as crashed).
- Misbehaviours are 0 -> 1 transitions of the crashed flag in their logs, so an onset while the previous
  misbehaviour is still on (busy at o - 1) is no new misbehaviour: it is `merged` and reported.
- precision TP/(TP+FP), recall TP/(TP+FN), FPR FP/(FP+TN), accuracy, F1 = 2TP/(2TP+FP+FN) and
  F3 = TP/(TP + 0.1 FP + 0.9 FN). F-beta = (1+b^2) TP / ((1+b^2) TP + b^2 FN + FP); at b = 3 that is
  10 TP / (10 TP + 9 FN + FP), the same number (divide by 10). A ratio with a zero denominator is NaN (their code
  prints "undefined" and writes 0 for every figure when TP = 0; we keep FPR and the rest where they are defined).
- Beyond their code: AUROC and AUPRC over windows (misbehaviour windows positive, nominal windows negative; AUROC as
  drive.metrics.auroc = sklearn roc_auc_score, AUPRC as drive.metrics.average_precision = sklearn's
  average_precision_score, both reproduced without sklearn); the median lead time: per misbehaviour the first
  step of the horizon [o - H, o) (H = 3 s, busy steps skipped) whose raw score reaches t, lead = (o - step) / fps
  s, median over misbehaviours with a crossing.
- 95 % intervals for every figure: a bootstrap over EPISODES, nominal and shifted episodes resampled separately
  with replacement (a replicate needs nominal runs to fit its threshold), the threshold refitted and every figure
  recomputed; percentile interval [2.5, 97.5] over the B replicates (NaN replicates left out), numpy
  Generator(seed): drive.metrics.bootstrap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from scipy import stats

from drive import metrics

FPS = 50  # gymnasium/envs/box2d/car_racing.py: FPS = 50, one step per frame
CONFIDENCE_LEVELS = (0.95, 0.99, 0.999, 0.9999, 0.99999)
TTMS = (1, 2, 3)
AGGREGATES = ("max", "mean")
THRESHOLD_FITS = ("gamma", "quantile")


@dataclass(frozen=True)
class Episode:
    scores: np.ndarray
    """(T,) the monitor's score per step, higher = more alarming"""
    onsets: Sequence[int] = ()
    """misbehaviour onset steps; empty for a nominal run"""
    nominal: bool = False
    """a nominal run (its windows count FP / TN); a run with a misbehaviour must be shifted (nominal=False)"""
    busy: np.ndarray | None = field(default=None, repr=False)
    """(T,) bool, steps inside a misbehaviour; None: only the onset steps"""

    def __post_init__(self) -> None:
        scores = np.asarray(self.scores, np.float64)
        if scores.ndim != 1 or not np.isfinite(scores).all():
            raise ValueError(f"Episode.scores must be a finite 1-D array, got shape {scores.shape}")
        onsets = tuple(sorted({int(o) for o in self.onsets}))
        if onsets and not 0 <= onsets[0] <= onsets[-1] < len(scores):
            raise ValueError(f"Episode.onsets {onsets} fall outside the episode's {len(scores)} steps")
        if self.nominal and onsets:
            raise ValueError("a nominal episode has no misbehaviour; pass a run with one as nominal=False")
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
    smooth_nominal: bool = True
    """nominal scores pass a trailing mean over fps frames before windowing, as in the field's code"""
    overlap_tolerance: int = 2
    """a misbehaviour window holding more labelled frames than this is not scorable (the field: 2)"""
    lead_horizon_s: float = 3.0
    """the lead time looks this far back before each onset (s)"""

    def __post_init__(self) -> None:
        if self.aggregate not in AGGREGATES or self.threshold_fit not in THRESHOLD_FITS or self.fps < 1:
            raise ValueError(f"ProtocolConfig: aggregate in {AGGREGATES}, threshold_fit in {THRESHOLD_FITS}, fps >= 1")


class Figures(NamedTuple):
    threshold: float
    tp: float
    fn: float
    fp: float
    tn: float
    precision: float
    recall: float
    fpr: float
    accuracy: float
    f1: float
    f3: float
    auroc: float
    auprc: float
    median_lead_s: float


@dataclass(frozen=True)
class Row:
    level: float
    ttm: int
    value: Figures
    low: Figures
    """2.5 % bootstrap percentile of each figure"""
    high: Figures
    """97.5 % bootstrap percentile"""
    before_start: int
    """misbehaviours whose window would start before step 0 (not scorable)"""
    overlap: int
    """misbehaviours whose window overlaps an earlier misbehaviour or its window (not scorable)"""
    merged: int
    """onsets while the previous misbehaviour was still on (no new misbehaviour)"""


# -- windows -----------------------------------------------------------------------------------------------------------
def _aggregate(windows: np.ndarray, how: str) -> np.ndarray:  # (K, W) -> (K,)
    return windows.max(1) if how == "max" else windows.mean(1)


def nominal_windows(scores: np.ndarray, cfg: ProtocolConfig) -> np.ndarray:
    """(K,) aggregates of the K = T // fps consecutive windows of a nominal episode's (smoothed) scores."""
    w = cfg.fps
    if cfg.smooth_nominal:  # trailing mean over w frames, fewer at the start (rolling(w, min_periods=1))
        csum = np.concatenate([[0.0], np.cumsum(scores)])
        t = np.arange(1, len(scores) + 1)
        scores = (csum[t] - csum[np.maximum(t - w, 0)]) / np.minimum(t, w)
    k = len(scores) // w
    return _aggregate(scores[: k * w].reshape(k, w), cfg.aggregate)


def misbehaviour_windows(ep: Episode, ttm: int, cfg: ProtocolConfig) -> tuple[np.ndarray, int, int, int]:
    """(M,) aggregates of the scorable misbehaviour windows at `ttm` s, and the counts before_start, overlap, merged."""
    assert ep.busy is not None
    w, labelled = cfg.fps, ep.busy.copy()
    out: list[float] = []
    before_start = overlap = merged = 0
    for o in ep.onsets:
        if o > 0 and ep.busy[o - 1]:
            merged += 1
            continue
        start, end = o - ttm * w, o - (ttm - 1) * w  # window [start, end)
        if start < 0:
            before_start += 1
        elif labelled[start : end + 1].sum() > cfg.overlap_tolerance:  # the field's .loc[start:end] holds both ends
            overlap += 1
        else:
            labelled[start : end + 1] = True
            out.append(float(_aggregate(ep.scores[None, start:end], cfg.aggregate)[0]))
    return np.asarray(out), before_start, overlap, merged


# -- thresholds and figures --------------------------------------------------------------------------------------------
def gamma_threshold(values: np.ndarray, levels: Sequence[float]) -> np.ndarray:
    """(L,) ppf at each level of a Gamma(shape, loc=0, scale) fitted by maximum likelihood to the non-zero values.
    Fewer than two distinct non-zero values (a monitor without that signal: GMLE's epistemic variance is 0) fit no
    Gamma: the threshold is then the least value above every nominal score, so it fires on nothing seen nominally."""
    v = np.asarray(values, np.float64)
    if (v < 0).any():
        raise ValueError("a Gamma threshold needs non-negative scores (the field fits reconstruction errors)")
    v = v[v != 0]
    if len(v) < 2 or np.ptp(v) == 0:
        top = float(np.max(values)) if len(values) else 0.0
        return np.full(len(levels), np.nextafter(top, np.inf))
    shape, loc, scale = stats.gamma.fit(v, floc=0)
    return np.asarray(stats.gamma.ppf(np.asarray(levels), shape, loc=loc, scale=scale))


def fit_threshold(values: np.ndarray, levels: Sequence[float], how: str = "gamma") -> np.ndarray:
    """(L,) thresholds at the confidence levels, from nominal window aggregates."""
    if how == "gamma":
        return gamma_threshold(values, levels)
    return np.quantile(np.asarray(values, np.float64), np.asarray(levels), method="higher")


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def rates(tp: float, fn: float, fp: float, tn: float) -> tuple[float, float, float, float, float, float]:
    """precision, recall, FPR, accuracy, F1 and F3 = TP / (TP + 0.1 FP + 0.9 FN) from window counts."""
    return (_ratio(tp, tp + fp), _ratio(tp, tp + fn), _ratio(fp, fp + tn), _ratio(tp + tn, tp + fn + fp + tn),
            _ratio(2 * tp, 2 * tp + fp + fn), _ratio(tp, tp + 0.1 * fp + 0.9 * fn))  # fmt: skip


def _ranking(positive: np.ndarray, negative: np.ndarray) -> tuple[float, float]:
    if len(positive) == 0 or len(negative) == 0:
        return float("nan"), float("nan")
    return metrics.auroc(negative, positive), metrics.average_precision(positive, negative)


def lead_horizons(ep: Episode, cfg: ProtocolConfig) -> list[tuple[int, np.ndarray]]:
    """Per (non-merged) misbehaviour: (the lead of the horizon's first step in steps, (n,) running max of the score
    over the horizon [o - H, o), busy steps at -inf). The first crossing of t is a searchsorted on the running max."""
    assert ep.busy is not None
    h, out = int(round(cfg.lead_horizon_s * cfg.fps)), []
    for o in ep.onsets:
        if o > 0 and ep.busy[o - 1]:
            continue
        start = max(0, o - h)
        window = np.where(ep.busy[start:o], -np.inf, ep.scores[start:o])
        out.append((o - start, np.maximum.accumulate(window) if len(window) else window))
    return out


def median_lead_s(horizons: Sequence[tuple[int, np.ndarray]], threshold: float, fps: int) -> float:
    leads = [lead - int(np.searchsorted(run, threshold)) for lead, run in horizons if len(run) and run[-1] >= threshold]
    return float(np.median(leads)) / fps if leads else float("nan")


# -- the protocol ------------------------------------------------------------------------------------------------------
class _Prepared(NamedTuple):
    nominal: list[np.ndarray]  # per nominal episode: (K_e,) window aggregates
    windows: dict[int, list[np.ndarray]]  # per TTM, per shifted episode: (M_e,) misbehaviour window aggregates
    horizons: list[list[tuple[int, np.ndarray]]]  # per shifted episode: lead_horizons


def _figures(prep: _Prepared, nom: np.ndarray, shifted: np.ndarray, levels: Sequence[float], ttms: Sequence[int],
             cfg: ProtocolConfig) -> np.ndarray:  # fmt: skip
    """(L, TTM, F) every figure of the episodes picked by the index arrays `nom` and `shifted`."""
    negative = np.concatenate([prep.nominal[i] for i in nom])  # (N,)
    thresholds = fit_threshold(negative, levels, cfg.threshold_fit)  # (L,)
    horizons = [h for i in shifted for h in prep.horizons[i]]
    leads = [median_lead_s(horizons, t, cfg.fps) for t in thresholds]
    out = np.full((len(levels), len(ttms), len(Figures._fields)), np.nan)
    for j, ttm in enumerate(ttms):
        positive = np.concatenate([np.empty(0), *(prep.windows[ttm][i] for i in shifted)])  # (M,)
        auroc, auprc = _ranking(positive, negative)
        for i, t in enumerate(thresholds):
            tp, fp = float((positive >= t).sum()), float((negative > t).sum())
            fn, tn = len(positive) - tp, len(negative) - fp
            out[i, j] = (t, tp, fn, fp, tn, *rates(tp, fn, fp, tn), auroc, auprc, leads[i])
    return out


def evaluate(episodes: Sequence[Episode], cfg: ProtocolConfig = ProtocolConfig(),
             levels: Sequence[float] = CONFIDENCE_LEVELS, ttms: Sequence[int] = TTMS, n_boot: int = 1000,
             seed: int = 0) -> list[Row]:  # fmt: skip
    """One Row per (level, TTM): the figures on all episodes and their 95 % bootstrap interval over episodes."""
    nominal = [e for e in episodes if e.nominal]
    shifted = [e for e in episodes if not e.nominal]
    if not nominal or not shifted:
        raise ValueError(f"the protocol needs nominal and shifted episodes, got {len(nominal)} and {len(shifted)}")
    per_ttm = {ttm: [misbehaviour_windows(e, ttm, cfg) for e in shifted] for ttm in ttms}
    prep = _Prepared([nominal_windows(e.scores, cfg) for e in nominal],
                     {ttm: [w[0] for w in ws] for ttm, ws in per_ttm.items()},
                     [lead_horizons(e, cfg) for e in shifted])  # fmt: skip
    if sum(len(w) for w in prep.nominal) < 2:
        raise ValueError(f"nominal episodes shorter than two windows of {cfg.fps} steps: no threshold to fit")

    def stat(nom: np.ndarray, shift: np.ndarray) -> np.ndarray:
        return _figures(prep, nom, shift, levels, ttms, cfg)

    value = stat(np.arange(len(nominal)), np.arange(len(shifted)))
    low, high = metrics.bootstrap(stat, (len(nominal), len(shifted)), n_boot, seed)
    rows = []
    for i, level in enumerate(levels):
        for j, ttm in enumerate(ttms):
            before, overlap, merged = (int(n) for n in np.array([w[1:] for w in per_ttm[ttm]]).sum(0))
            rows.append(Row(level, ttm, Figures(*value[i, j]), Figures(*low[i, j]), Figures(*high[i, j]),
                            before, overlap, merged))  # fmt: skip
    return rows
