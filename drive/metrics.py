"""Regression metrics for probabilistic predictions, one module used by every task.

Everything takes tensors or arrays (never a controller) and returns Python floats or numpy arrays; inputs are
converted to float64 numpy so a metric never depends on the dtype or device a model ran in. A predictive
distribution is Gaussian N(mean, var) per element unless a function says otherwise; all arrays broadcast and every
score is averaged over all elements (batch x output dims).

Definitions (stated because the literature uses several):
- nll: mean Gaussian negative log-likelihood with the full constant, 0.5*log(2*pi*var) + (y - mean)^2 / (2*var).
- crps_gaussian: closed form (Gneiting et al. 2005), sigma * [z(2*Phi(z) - 1) + 2*phi(z) - 1/sqrt(pi)],
  z = (y - mean)/sigma; equals `scoringrules.crps_normal`.
- crps_ensemble: CRPS of the empirical distribution of S samples, E|X - y| - 0.5*E|X - X'| ("nrg", equals
  scoringrules' default "qd"); with fair=True the unbiased version dividing the second term by S(S-1) ("fair").
- pit: probability integral transform F(y) = Phi((y - mean)/sigma), uniform on [0, 1] for a calibrated forecast.
- pit_wasserstein: the Wasserstein-1 distance between the empirical PIT distribution and U(0, 1), the integral over
  [0, 1] of |F_n(u) - u|, computed exactly from the sorted PIT values.
- ece (regression calibration error): for quantile levels p_j = 0.05, 0.10, ..., 0.95 the observed frequency
  freq_j = mean(PIT <= p_j) of targets at or below the predicted p_j-quantile; ece = mean_j |freq_j - p_j|, an L1
  (expected absolute) calibration error, 0 for a perfectly calibrated forecast, 0.5 at worst. The calibration curve
  is Kuleshov, Fenner & Ermon (ICML 2018), but their calibration error is squared, sum_j w_j (p_j - freq_j)^2; the
  absolute, unweighted mean used here is uncertainty-toolbox's `mean_absolute_calibration_error` (Chung et al. 2021)
  on these 19 levels. Not comparable with a squared figure.
- coverage(level) / width(level): fraction of targets inside the central interval mean +- z*sigma with
  z = Phi^-1((1 + level)/2), and the mean width 2*z*sigma of that interval.
- auroc(score_in, score_out): probability that an out-of-distribution (perturbed) input gets a higher uncertainty
  score than an in-distribution one, ties counted one half (Mann-Whitney U / (n_in * n_out)).
- average_precision(positive, negative): sklearn's average_precision_score (AUPRC), reproduced without sklearn.
- bootstrap(statistic, sizes): a percentile interval over resamples with replacement, strata resampled apart (the
  misbehaviour protocol's episodes, drive/studies/misbehaviour/protocol.py). Percentiles of the replicates: the interval
  stays inside the statistic's range.
- wilson(k, n, z): the Wilson score interval of a proportion k / n, (c -+ h) with c = (k + z^2/2) / (n + z^2) and
  h = z / (n + z^2) sqrt(k (n - k) / n + z^2 / 4) (Wilson 1927); inside [0, 1], unlike p -+ z sqrt(p (1 - p) / n).
- holm(pvalues): Holm-Bonferroni adjusted p-values (Holm 1979), the i-th smallest of m becoming
  max over j <= i of min(1, (m - j + 1) p_(j)); those <= alpha are the rejections of Holm's step-down procedure
  at family-wise level alpha (statsmodels' multipletests(method="holm")).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

ECE_LEVELS = np.round(np.arange(1, 20) * 0.05, 2)  # 0.05 ... 0.95
INTERVAL_LEVELS = (0.5, 0.9, 0.95)
_VAR_FLOOR = 1e-12


def _np(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _std(var: Any) -> np.ndarray:
    var = _np(var)
    if np.any(var < 0) or not np.all(np.isfinite(var)):
        raise ValueError("predictive variances must be finite and non-negative")
    return np.sqrt(np.maximum(var, _VAR_FLOOR))


# -- point errors ------------------------------------------------------------------------------------------------------
def mse(mean: Any, y: Any) -> float:
    return float(np.mean((_np(mean) - _np(y)) ** 2))


def mae(mean: Any, y: Any) -> float:
    return float(np.mean(np.abs(_np(mean) - _np(y))))


def rmse(mean: Any, y: Any) -> float:
    return math.sqrt(mse(mean, y))


# -- proper scores -----------------------------------------------------------------------------------------------------
def gaussian_nll(mean: Any, var: Any, y: Any) -> float:
    return float(np.mean(gaussian_nll_elementwise(mean, var, y)))


def crps_gaussian_elementwise(mean: Any, var: Any, y: Any) -> np.ndarray:
    from scipy import stats  # here, not at import: scipy.stats costs ~1.3 s to load

    sigma = _std(var)
    z = (_np(y) - _np(mean)) / sigma
    return sigma * (z * (2 * stats.norm.cdf(z) - 1) + 2 * stats.norm.pdf(z) - 1 / math.sqrt(math.pi))


def crps_gaussian(mean: Any, var: Any, y: Any) -> float:
    return float(np.mean(crps_gaussian_elementwise(mean, var, y)))


def crps_ensemble(samples: Any, y: Any, fair: bool = False) -> float:
    """Sample-based CRPS. samples (S, ...) with the sample axis first (as controllers return them), y (...)."""
    x = np.sort(_np(samples), axis=0)  # (S, ...)
    n = x.shape[0]
    if n < 1 or (fair and n < 2):
        raise ValueError(f"crps_ensemble needs at least {2 if fair else 1} samples, got {n}")
    term1 = np.mean(np.abs(x - _np(y)[None]), axis=0)
    # sum_{i,j} |x_i - x_j| over sorted samples = 2 * sum_i (2i - n - 1) x_(i), i = 1..n
    weights = (2 * np.arange(1, n + 1) - n - 1).reshape((n,) + (1,) * (x.ndim - 1))
    pair_sum = 2 * np.sum(weights * x, axis=0)
    term2 = pair_sum / (2 * n * (n - 1)) if fair else pair_sum / (2 * n * n)
    return float(np.mean(term1 - term2))


# -- calibration -------------------------------------------------------------------------------------------------------
def pit(mean: Any, var: Any, y: Any) -> np.ndarray:
    from scipy import stats  # here, not at import: scipy.stats costs ~1.3 s to load

    return stats.norm.cdf((_np(y) - _np(mean)) / _std(var))


def pit_wasserstein(pit_values: Any) -> float:
    """Exact W1 between the empirical distribution of PIT values and U(0, 1)."""
    u = np.sort(_np(pit_values).ravel())
    n = u.size
    if n == 0:
        raise ValueError("pit_wasserstein needs at least one PIT value")
    if np.any((u < 0) | (u > 1)):
        raise ValueError("PIT values must lie in [0, 1]")
    edges = np.concatenate([[0.0], u, [1.0]])
    levels = np.arange(n + 1) / n  # F_n on [edges[i], edges[i+1])
    a, b = edges[:-1], edges[1:]
    # integral of |c - t| dt over [a, b]: split at t = c when c lies inside
    c = np.clip(levels, a, b)
    total = (c - a) * (levels - (a + c) / 2) + (b - c) * ((c + b) / 2 - levels)
    return float(np.sum(total))


def calibration_curve(pit_values: Any, levels: Any = ECE_LEVELS) -> tuple[np.ndarray, np.ndarray]:
    u = _np(pit_values).ravel()
    levels = _np(levels)
    return levels, np.array([np.mean(u <= p) for p in levels])


def ece(mean: Any, var: Any, y: Any, levels: Any = ECE_LEVELS) -> float:
    expected, observed = calibration_curve(pit(mean, var, y), levels)
    return float(np.mean(np.abs(observed - expected)))


def interval(mean: Any, var: Any, y: Any, level: float) -> tuple[float, float]:
    """(coverage, mean width) of the central `level` interval mean +- z*sigma."""
    from scipy import stats  # here, not at import: scipy.stats costs ~1.3 s to load

    if not 0 < level < 1:
        raise ValueError(f"interval level must be in (0, 1), got {level}")
    z = stats.norm.ppf(0.5 + level / 2)
    sigma = _std(var)
    inside = np.abs(_np(y) - _np(mean)) <= z * sigma
    width = np.broadcast_to(2 * z * sigma, inside.shape)
    return float(np.mean(inside)), float(np.mean(width))


# -- out-of-distribution detection -------------------------------------------------------------------------------------
def auroc(score_in: Any, score_out: Any) -> float:
    """Area under the ROC curve of `score` separating out-of-distribution (positive) from in-distribution inputs."""
    from scipy import stats  # here, not at import: scipy.stats costs ~1.3 s to load

    s_in, s_out = _np(score_in).ravel(), _np(score_out).ravel()
    if s_in.size == 0 or s_out.size == 0:
        raise ValueError("auroc needs at least one in-distribution and one out-of-distribution score")
    ranks = stats.rankdata(np.concatenate([s_in, s_out]))  # average ranks: ties count one half
    u = ranks[s_in.size :].sum() - s_out.size * (s_out.size + 1) / 2
    return float(u / (s_in.size * s_out.size))


def weighted_auroc(score_in: Any, score_out: Any, weight_out: Any) -> float:
    """`auroc` with each out-of-distribution (positive) score weighted (sklearn roc_auc_score's sample_weight, the
    in-distribution scores weight 1): the weighted Mann-Whitney statistic sum_p w_p (#in below p + #in tied / 2) /
    (sum_p w_p #in). With every weight 1 it is `auroc` to the last digit (both count the same half-integers)."""
    s_in, s_out = np.sort(_np(score_in).ravel()), _np(score_out).ravel()
    w = np.asarray(weight_out, np.float64).ravel()
    if s_in.size == 0 or s_out.size == 0 or w.shape != s_out.shape or (w < 0).any() or w.sum() <= 0:
        raise ValueError("weighted_auroc needs scores on both sides and one non-negative weight per positive score")
    below, up_to = np.searchsorted(s_in, s_out, "left"), np.searchsorted(s_in, s_out, "right")
    return float(np.sum(w * ((below + up_to) / 2)) / (w.sum() * s_in.size))


def average_precision(positive: np.ndarray, negative: np.ndarray, weight_positive: np.ndarray | None = None) -> float:
    """sklearn's average_precision_score: sum_n (R_n - R_{n-1}) P_n over the distinct scores, highest first; with
    `weight_positive`, its sample_weight (each positive weighted, the negatives 1)."""
    scores = np.concatenate([positive, negative])
    labels = np.concatenate([np.ones(len(positive)), np.zeros(len(negative))])
    order = np.argsort(-scores, kind="mergesort")
    scores, labels = scores[order], labels[order]
    last = np.r_[np.flatnonzero(np.diff(scores)), len(scores) - 1]  # the last index of each run of tied scores
    if weight_positive is None:
        tps = np.cumsum(labels)[last]
        precision = tps / (last + 1)
    else:
        weights = np.concatenate([np.asarray(weight_positive, np.float64), np.ones(len(negative))])[order]
        tps = np.cumsum(labels * weights)[last]
        precision = tps / np.cumsum(weights)[last]
    recall = tps / tps[-1]
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


# -- bootstrap intervals -----------------------------------------------------------------------------------------------
def bootstrap(
    statistic: Callable[..., Any], sizes: Sequence[int], n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of `statistic(*indices)` over n_boot resamples: per stratum s an index array of sizes[s]
    units drawn with replacement from range(sizes[s]) (strata resampled apart). NaN replicates are left out."""
    if n_boot < 1 or any(n < 1 for n in sizes):
        raise ValueError(f"bootstrap needs n_boot >= 1 and a unit in every stratum, got {n_boot}, {list(sizes)}")
    rng = np.random.default_rng(seed)
    reps = np.stack([np.asarray(statistic(*(rng.integers(0, n, n) for n in sizes)), np.float64) for _ in range(n_boot)])
    tail = 100 * (1 - level) / 2
    with warnings.catch_warnings():  # a figure NaN in every replicate (no misbehaviour at all) stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        low, high = np.nanpercentile(reps, [tail, 100 - tail], axis=0)
    return low, high


def wilson(k: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval (low, high) of the proportion k / n; NaN for n = 0."""
    if n < 0 or not 0 <= k <= max(n, 0):
        raise ValueError(f"wilson needs 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return math.nan, math.nan
    center = (k + z * z / 2) / (n + z * z)
    half = z / (n + z * z) * math.sqrt(k * (n - k) / n + z * z / 4)
    return max(0.0, center - half), min(1.0, center + half)


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """(m,) Holm-Bonferroni adjusted p-values, in the order given."""
    p = np.asarray(pvalues, np.float64)
    if p.ndim != 1 or not np.all((p >= 0) & (p <= 1)):
        raise ValueError(f"holm needs a 1-D array of p-values in [0, 1], got {p}")
    order = np.argsort(p, kind="mergesort")
    steps = np.minimum(1.0, (len(p) - np.arange(len(p))) * p[order])  # (m - j + 1) p_(j), j = 1..m
    out = np.empty_like(p)
    out[order] = np.maximum.accumulate(steps)
    return out


# -- uncertainty decomposition -----------------------------------------------------------------------------------------
def decomposition(aleatoric_var: Any, epistemic_var: Any) -> dict[str, float]:
    ale, epi = _np(aleatoric_var), _np(epistemic_var)
    total = ale + epi
    return {
        "aleatoric_var": float(np.mean(ale)),
        "epistemic_var": float(np.mean(epi)),
        "total_var": float(np.mean(total)),
        "epistemic_fraction": float(np.mean(epi) / max(np.mean(total), _VAR_FLOOR)),
        "mean_std": float(np.mean(np.sqrt(total))),
    }


def regression_report(pred: Any, y: Any, *, samples: Any = None, levels: tuple[float, ...] = INTERVAL_LEVELS) -> dict:
    """Every metric above for a `Prediction` (mean, aleatoric_var, epistemic_var; Gaussian with the total variance).

    `samples` (S, B, D), optional: Monte-Carlo draws of the predictive, adds the sample-based `crps_samples`.
    """
    mean, ale, epi = _np(pred.mean), _np(pred.aleatoric_var), _np(pred.epistemic_var)
    y = _np(y)
    if mean.shape != y.shape:
        raise ValueError(f"prediction mean {mean.shape} and targets {y.shape} differ in shape")
    var = ale + epi
    pit_values = pit(mean, var, y)
    report = {
        "n": int(y.size),
        "mse": mse(mean, y),
        "mae": mae(mean, y),
        "rmse": rmse(mean, y),
        "nll": gaussian_nll(mean, var, y),
        "crps": crps_gaussian(mean, var, y),
        "ece": ece(mean, var, y),
        "pit_w1": pit_wasserstein(pit_values),
    }
    if samples is not None:
        report["crps_samples"] = crps_ensemble(samples, y)
    for level in levels:
        cov, width = interval(mean, var, y, level)
        report[f"coverage_{round(level * 100):d}"] = cov
        report[f"width_{round(level * 100):d}"] = width
    report.update(decomposition(ale, epi))
    return report


def gaussian_nll_elementwise(mean: Any, var: Any, y: Any) -> np.ndarray:
    sigma2 = _std(var) ** 2
    return 0.5 * np.log(2 * math.pi * sigma2) + (_np(y) - _np(mean)) ** 2 / (2 * sigma2)


__all__ = [
    "auroc",
    "calibration_curve",
    "crps_ensemble",
    "crps_gaussian",
    "crps_gaussian_elementwise",
    "decomposition",
    "ece",
    "gaussian_nll",
    "gaussian_nll_elementwise",
    "holm",
    "interval",
    "mae",
    "mse",
    "pit",
    "pit_wasserstein",
    "regression_report",
    "rmse",
    "wilson",
]
