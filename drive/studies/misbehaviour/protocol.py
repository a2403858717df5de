"""Misbehaviour prediction on the field's protocol (nominal thresholds, TTM windows, F3, bootstrap intervals), with
four departures that keep a score without information from passing for a predictor; `FIELD` scores by their rules.

The protocol of Stocco et al. (SelfOracle, ICSE 2020; ThirdEye, ASE 2022) as used by Grewal, Tonella & Stocco,
"Predicting Safety Misbehaviours in Autonomous Driving Systems using Uncertainty Quantification" (ICST 2024). Every
rule below was read from their public code, ast-fortiss-tum/misbehaviour-prediction-with-uncertainty-quantification:
`compute_fp_and_tn`, `compute_tp_and_fn` and `get_threshold` in scripts/evaluate_failure_prediction_heatmaps_scores.py
(ThirdEye), scripts/evaluate_failure_prediction_selforacle.py (SelfOracle) and evaluate_models_dynamic_fps.py (MC
dropout, deep ensembles), which share the same three functions.

Input: per episode a per-step score (T,) (higher = more alarming), the misbehaviour onset steps, a nominal/shifted
flag and optionally a busy mask (T,) of steps inside a misbehaviour (default: only the onset steps). A nominal run
may misbehave too (a controller can leave the road on a clean camera): its onsets are never TP or FN (nominal means
no shift), they only mark the windows its false-positive count leaves out.

- Window length W = fps frames (1 s): CarRacing runs at FPS = 50 steps/s (gymnasium car_racing.py), so W = 50.
- Warm-up: the first warmup_s = 1 s (50 steps) of every episode is not scored, on either side. gymnasium's
  CarRacing zooms its camera in over its first second (car_racing.py render: zoom = 0.1 SCALE max(1 - t, 0) + ZOOM
  SCALE min(t, 1)), so every run opens on frames unlike the rest; in the field's windows each nominal episode's
  first window holds them.
- Scores: scoring `alike` (default) cuts both sides' windows from the same score: raw, or with `smooth` both through
  the same trailing mean over W frames (restarted at the warm-up's end, so the transient does not leak in). Scoring
  `field`: the nominal score smoothed by a trailing mean over W frames (pandas rolling(W, min_periods=1).mean(), their
  `sma_nominal`), the misbehaviour windows on the raw score (their code smooths only the nominal side).
- Nominal windows: per nominal episode, consecutive windows [s + kW, s + (k+1)W) from the warm-up's end s, the
  partial tail dropped; each window's aggregate (max, as in all their `*_compute_all.py` runs; mean available) is
  one nominal window. A window holding more than 2 steps of the run's own misbehaviours (busy) or of the lead
  horizon (3 s) before one of its onsets (where an alarm may be a true one) is left out and counted
  (`nominal_left_out`); the rest of that run is scored.
- Threshold: fitted on the nominal WINDOW aggregates (their `get_threshold(list_aggregated, ...)`), not on frames,
  so a confidence level is a per-window false-alarm rate. Gamma: zeros removed, scipy.stats.gamma.fit(floc=0),
  t = ppf(level); the field uses it for every monitor (SelfOracle's reconstruction error, ThirdEye's attention
  scores, MC dropout / ensemble variances), and so do we by default. `quantile`: the empirical quantile (numpy
  method "higher", an observed value), the way our fallback gate is calibrated; reported as a check. Any level in
  (0, 1); by default {0.95, 0.99, 0.999, 0.9999, 0.99999} (their cfg.CONFIDENCE_LEVEL; folders t95 ... t99999).
- Threshold split: `halves` (default): the nominal episodes alternate between two halves in the order given (1st,
  3rd, ... and 2nd, 4th, ...); the thresholds fitted on one half count the other half's false positives and the
  other way round, FP and TN pooled, so each nominal window is counted once, against a threshold fitted without it.
  Each misbehaviour window is scored against both halves' thresholds, weight 1/2 each: TP + FN is the number of
  misbehaviour windows and TP against FP keeps the field's balance; the lead times under both are pooled. The
  reported threshold is the one fitted on every nominal window (the one a deployment uses, the fallback's).
  `in_sample`: fitted and counted on the same windows, as the field does.
- Misbehaviour window at time to misbehaviour TTM s (any whole TTM >= 1), onset o: frames [o - TTM W,
  o - (TTM - 1) W), i.e. the W frames that START TTM s before the onset and end TTM - 1 s before it. At 50 steps/s:
  TTM 1 -> [o-50, o), TTM 2 -> [o-100, o-50), TTM 3 -> [o-150, o-100). TP if aggregate >= t, else FN; nominal FP if
  aggregate > t, else TN (their code's > and >=, kept).
- Not scorable ("undetectable" in their code), counted and reported, in neither TP nor FN: a window that would
  start before the first scored step (step 0, or the warm-up's end) (`before_start`); a window whose frames
  [o - TTM W, o - (TTM-1) W] (both ends, their .loc) hold more than 2 labelled frames (`overlap`), labelled = busy
  steps plus the windows of earlier scorable misbehaviours of that episode at that TTM (their code relabels each
  accepted window as crashed).
- Misbehaviours are 0 -> 1 transitions of the crashed flag in their logs, so an onset while the previous
  misbehaviour is still on (busy at o - 1) is no new misbehaviour: it is `merged` and reported.
- precision TP/(TP+FP), recall TP/(TP+FN), FPR FP/(FP+TN), accuracy, F1 = 2TP/(2TP+FP+FN) and
  F3 = TP/(TP + 0.1 FP + 0.9 FN). F-beta = (1+b^2) TP / ((1+b^2) TP + b^2 FN + FP); at b = 3 that is
  10 TP / (10 TP + 9 FN + FP), the same number (divide by 10). A ratio with a zero denominator is NaN (their code
  prints "undefined" and writes 0 for every figure when TP = 0; we keep FPR and the rest where they are defined).
- Beyond their code: AUROC and AUPRC over windows (misbehaviour windows positive, every scored nominal window
  negative, whatever the split: no threshold is fitted; AUROC as drive.metrics.auroc = sklearn roc_auc_score, AUPRC
  as drive.metrics.average_precision = sklearn's average_precision_score, both reproduced without sklearn); the
  median lead time: per misbehaviour the first step of the horizon [o - H, o) (H = 3 s, not before the warm-up's
  end, busy steps skipped) whose score reaches t, lead = (o - step) / fps s, median over misbehaviours with a
  crossing.
- Pooling over families (beyond their code, which scores one simulation at a time and pools nothing): the shifted
  episodes of a group of several shift families (Episode.family; the report's held_out and surrogate) are pooled
  over families, each family weighted equally: every shifted episode carries the weight N / (F n_f) (N shifted
  episodes, F families, n_f of its family's), so each family's episodes sum to N / F and all to N. TP and FN are
  sums of their windows' episode weights, the AUROC's and AUPRC's positives are weighted likewise (sklearn's
  sample_weight: drive.metrics.weighted_auroc, average_precision) and so is the median lead (`weighted_median`);
  FP and TN count nominal windows (weight 1). A family with more misbehaving episodes thus weighs no more in the
  pooled figures. With one family every weight is 1: the figures are the unweighted ones, to the last digit.
  `pooling="episodes"` weighs every episode 1 (FIELD does: their code says nothing on pooling, so we keep the
  plain pooling there and weight families in ours only).
- 95 % intervals for every figure: a bootstrap over EPISODES, nominal and shifted episodes resampled separately
  with replacement, the shifted ones within each family (pooling families: every replicate keeps every family, with
  its weights), and with `halves` each half its own stratum (a replicate's halves stay disjoint, as the split
  asks), the thresholds refitted and every figure recomputed; percentile interval [2.5, 97.5] over the B replicates
  (NaN replicates left out), numpy Generator(seed): drive.metrics.bootstrap. Percentiles of a figure's replicates
  stay inside the figure's range ([0, 1] for the rates).
- The windows, warm-up and left-out steps are cut in drive/studies/misbehaviour/windows.py; null controls run
  through this same pipeline in drive/studies/misbehaviour/nulls.py (block-permuted and information-free scores).

Departures from the field, each selectable back: `FIELD` = ProtocolConfig(scoring="field",
threshold_split="in_sample", warmup_s=0.0, pooling="episodes") undoes the first three (`drive bench misbehaviour
--protocol field`); the fourth is the caller's (pass no misbehaving nominal run to drop them). Pooling over families
(above) is no departure from their rules, which pool nothing; FIELD pools episodes.
1. Windows scored alike. The max of W raw frames lies well above the max of their W-frame mean for any noisy score,
   so under the field's windows a misbehaviour window outscores the nominal ones whatever the score knows. i.i.d.
   Gamma(2, 1) noise, the same in 20 nominal and 40 shifted 500-step episodes (onset at step 300), level 0.999,
   TTM 2: by the field's rules recall 1.00, F3 0.99, AUROC 1.000; with only the windows scored alike F3 0.03, AUROC
   0.49. exp(0.5 x), x a Gaussian AR(1) with phi 0.5 and unit variance: F3 0.99 by the field's rules, 0.03 alike
   (tests/drive/studies/misbehaviour/test_protocol.py:
   test_the_fields_asymmetric_windows_let_noise_pass_and_alike_windows_do_not and
   test_the_inflation_figures_quoted_in_the_protocols_docstring). With the defaults such scores sit at chance up to phi
   0.98 (test_an_information_free_score_sits_at_chance_with_the_defaults).
2. Warm-up not scored (above): the reset transient is no property of the monitor. A spike in every nominal run's
   first second becomes the threshold without it (test_the_reset_transient_is_not_scored).
3. Out-of-sample thresholds (halves): a threshold fitted on the windows it then counts has seen its own false
   positives, so its FPR is not what a deployment meets (test_thresholds_count_false_positives_out_of_sample).
4. Misbehaving nominal runs stay in, their misbehaviour stretches left out: dropping such a run drops its clean
   stretches with it, and the runs a controller fails on without a shift are the likeliest to be hard for it, so
   the false-alarm count would be taken on its easiest roads
   (test_a_misbehaving_nominal_run_stays_in_and_its_misbehaviour_is_left_out).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
from scipy import stats

from drive import metrics
from drive.studies.misbehaviour.rows import Figures, Row
from drive.studies.misbehaviour.windows import (
    DEFAULTS,
    FIELD,
    FPS,
    SCORINGS,
    Episode,
    ProtocolConfig,
    lead_horizons,
    lead_steps,
    misbehaviour_windows,
    nominal_windows,
)

__all__ = ["DEFAULTS", "FIELD", "FPS", "LEVELS", "SCORINGS", "TTMS", "Episode", "Figures", "ProtocolConfig",
           "Row", "evaluate", "family_strata", "family_weights", "fit_threshold", "gamma_threshold",
           "misbehaviour_windows", "nominal_windows", "rates", "scored_windows", "weighted_median"]  # fmt: skip

LEVELS = (0.95, 0.99, 0.999, 0.9999, 0.99999)  # the confidence levels scored by default (the field's)
TTMS = (1, 2, 3)


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
    return (
        _ratio(tp, tp + fp),
        _ratio(tp, tp + fn),
        _ratio(fp, fp + tn),
        _ratio(tp + tn, tp + fn + fp + tn),
        _ratio(2 * tp, 2 * tp + fp + fn),
        _ratio(tp, tp + 0.1 * fp + 0.9 * fn),
    )


def _ranking(positive: np.ndarray, weight: np.ndarray, negative: np.ndarray) -> tuple[float, float]:
    if len(positive) == 0 or len(negative) == 0:
        return float("nan"), float("nan")
    return metrics.weighted_auroc(negative, positive, weight), metrics.average_precision(positive, negative, weight)


def weighted_median(values: Sequence[float] | np.ndarray, weights: Sequence[float] | np.ndarray) -> float:
    """The value where the weights sorted by value reach half their total; where a value's cumulative weight is
    exactly half, the mean of it and the next (with equal weights: numpy's median, to the last digit)."""
    v, w = np.asarray(values, np.float64), np.asarray(weights, np.float64)
    order = np.argsort(v, kind="stable")
    v, cum = v[order], np.cumsum(w[order])
    k = int(np.searchsorted(cum, cum[-1] / 2))  # the first value whose cumulative weight reaches half
    return float((v[k] + v[k + 1]) / 2) if cum[k] == cum[-1] / 2 and k + 1 < len(v) else float(v[k])


# -- pooling over families ---------------------------------------------------------------------------------------------
def family_strata(episodes: Sequence[Episode], cfg: ProtocolConfig = DEFAULTS) -> dict[str, np.ndarray]:
    """{family: indices into `episodes`} in order of first appearance (pooling families), or every episode in one
    stratum "" (pooling episodes): the bootstrap's shifted strata."""
    if cfg.pooling == "episodes":
        return {"": np.arange(len(episodes))}
    out: dict[str, list[int]] = {}
    for i, e in enumerate(episodes):
        out.setdefault(e.family, []).append(i)
    return {f: np.asarray(idx, np.intp) for f, idx in out.items()}


def family_weights(episodes: Sequence[Episode], cfg: ProtocolConfig = DEFAULTS) -> np.ndarray:
    """(N,) each shifted episode's weight: every family's episodes sum to N / (number of families), so the weights
    sum to N and each family weighs the same; 1 each with one family or pooling episodes."""
    strata = family_strata(episodes, cfg)
    out = np.ones(len(episodes))
    if len(strata) > 1:
        for idx in strata.values():
            out[idx] = len(episodes) / len(strata) / len(idx)
    return out


def scored_windows(episodes: Sequence[Episode], ttms: Sequence[int], cfg: ProtocolConfig = DEFAULTS) -> dict:
    """{family: {str(TTM): the misbehaviour windows scorable at that TTM}} of the shifted episodes: what each
    family's figures rest on (the scores do not matter, only the onsets, busy steps and warm-up)."""
    out: dict[str, dict[str, int]] = {}
    for e in episodes:
        if not e.nominal:
            by = out.setdefault(e.family, {str(t): 0 for t in ttms})
            for t in ttms:
                by[str(t)] += len(misbehaviour_windows(e, t, cfg)[0])
    return out


# -- the protocol ------------------------------------------------------------------------------------------------------
class _Prepared(NamedTuple):
    nominal: list[np.ndarray]  # per nominal episode: (K_e,) window aggregates
    windows: dict[int, list[np.ndarray]]  # per TTM, per shifted episode: (M_e,) misbehaviour window aggregates
    horizons: list[list[tuple[int, np.ndarray]]]  # per shifted episode: lead_horizons
    weights: np.ndarray  # (N,) per shifted episode: its weight (family_weights)


def _cat(arrays: Iterable[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.empty(0), *arrays])


def _figures(
    prep: _Prepared,
    folds: Sequence[np.ndarray],
    shifted: np.ndarray,
    levels: Sequence[float],
    ttms: Sequence[int],
    cfg: ProtocolConfig,
) -> np.ndarray:
    """(L, TTM, F) every figure of the nominal episodes in `folds` (index arrays) and the shifted ones in `shifted`.
    One fold: in-sample, thresholds fitted on it count its false positives. Two (the halves): each half's thresholds
    count the other half's false positives, and each misbehaviour window is scored against both, weight 1/2 each.
    Each misbehaviour window and lead time carries its episode's weight (prep.weights): TP, FN, the AUROC's and
    AUPRC's positives and the median lead are weighted, FP and TN count nominal windows."""
    out = np.full((len(levels), len(ttms), len(Figures._fields)), np.nan)
    negatives = [_cat(prep.nominal[i] for i in fold) for fold in folds]
    if any(len(n) == 0 for n in negatives):  # a replicate that drew only fully left-out nominal runs into a fold
        return out
    every = _cat(negatives)  # (N,) each nominal window once
    deployed = fit_threshold(every, levels, cfg.threshold_fit)  # (L,) the reported threshold: fitted on all
    if len(folds) == 1:
        counted = [(deployed, every)]
    else:  # (thresholds fitted on one half, the other half's windows they count)
        counted = [
            (fit_threshold(negatives[0], levels, cfg.threshold_fit), negatives[1]),
            (fit_threshold(negatives[1], levels, cfg.threshold_fit), negatives[0]),
        ]
    horizons = [h for i in shifted for h in prep.horizons[i]]
    h_weight = np.array([prep.weights[i] for i in shifted for _ in prep.horizons[i]])
    leads = [[crossed for t, _ in counted for crossed in lead_steps(horizons, t[i])] for i in range(len(levels))]
    for j, ttm in enumerate(ttms):
        positive = _cat(prep.windows[ttm][i] for i in shifted)  # (M,)
        weight = _cat(np.full(len(prep.windows[ttm][i]), prep.weights[i]) for i in shifted)  # (M,)
        auroc, auprc = _ranking(positive, weight, every)
        for i in range(len(levels)):
            tp = float(np.mean([weight[positive >= t[i]].sum() for t, _ in counted]))
            fp = float(sum((negative > t[i]).sum() for t, negative in counted))
            fn, tn = float(weight.sum()) - tp, len(every) - fp
            lead = (
                weighted_median([n for _, n in leads[i]], h_weight[[k for k, _ in leads[i]]]) / cfg.fps
                if leads[i]
                else float("nan")
            )
            out[i, j] = (deployed[i], tp, fn, fp, tn, *rates(tp, fn, fp, tn), auroc, auprc, lead)
    return out


def nominal_folds(n_nominal: int, cfg: ProtocolConfig) -> list[np.ndarray]:
    """The nominal episodes' index arrays: all of them in one (in_sample), or the halves, alternating by order."""
    if cfg.threshold_split == "in_sample":
        return [np.arange(n_nominal)]
    return [np.arange(0, n_nominal, 2), np.arange(1, n_nominal, 2)]


def evaluate(
    episodes: Sequence[Episode],
    cfg: ProtocolConfig = DEFAULTS,
    levels: Sequence[float] = LEVELS,
    ttms: Sequence[int] = TTMS,
    n_boot: int = 1000,
    seed: int = 0,
) -> list[Row]:
    """One Row per (level, TTM): the figures on all episodes and their 95 % bootstrap interval over episodes; the
    shifted episodes of several families (Episode.family) pooled as cfg.pooling says (each family weighted equally
    by default), resampled within each family."""
    nominal = [e for e in episodes if e.nominal]
    shifted = [e for e in episodes if not e.nominal]
    if not nominal or not shifted:
        raise ValueError(f"the protocol needs nominal and shifted episodes, got {len(nominal)} and {len(shifted)}")
    if not all(0 < level < 1 for level in levels) or not all(int(t) == t >= 1 for t in ttms):
        raise ValueError(f"levels must lie in (0, 1) and TTMs be whole seconds >= 1, got {levels} and {ttms}")
    split = nominal_folds(len(nominal), cfg)
    per_ttm = {ttm: [misbehaviour_windows(e, ttm, cfg) for e in shifted] for ttm in ttms}
    scored = [nominal_windows(e, cfg) for e in nominal]
    strata = list(family_strata(shifted, cfg).values())
    prep = _Prepared(
        [w for w, _ in scored],
        {ttm: [w[0] for w in ws] for ttm, ws in per_ttm.items()},
        [lead_horizons(e, cfg) for e in shifted],
        family_weights(shifted, cfg),
    )
    counts = [sum(len(prep.nominal[i]) for i in fold) for fold in split]
    if sum(counts) < 2 or min(counts) < 1:
        raise ValueError(
            f"too few nominal windows of {cfg.fps} steps to fit a threshold: {counts} in "
            f"{len(nominal)} nominal episodes ({cfg.threshold_split})"
        )

    def stat(*picks: np.ndarray) -> np.ndarray:  # one index array per fold, then one per family (a stratum each)
        folds = [fold[p] for fold, p in zip(split, picks[: len(split)], strict=True)]
        runs = np.concatenate([family[p] for family, p in zip(strata, picks[len(split) :], strict=True)])
        return _figures(prep, folds, runs, levels, ttms, cfg)

    value = stat(*(np.arange(len(f)) for f in (*split, *strata)))
    low, high = metrics.bootstrap(stat, [len(f) for f in (*split, *strata)], n_boot, seed)
    left = sum(n for _, n in scored)
    rows = []
    for i, level in enumerate(levels):
        for j, ttm in enumerate(ttms):
            before, overlap, merged = (int(n) for n in np.array([w[1:] for w in per_ttm[ttm]]).sum(0))
            rows.append(
                Row(
                    level,
                    ttm,
                    Figures(*value[i, j]),
                    Figures(*low[i, j]),
                    Figures(*high[i, j]),
                    before,
                    overlap,
                    merged,
                    left,
                )
            )
    return rows
