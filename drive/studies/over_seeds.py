"""Statistics over training seeds, shared by the benchmarks that train several seeds of each controller
(`drive bench controllers`, `drive bench misbehaviour`, `drive bench generalisation`).

**Intervals.** `interval` gives the mean over seeds with a 95 % percentile bootstrap interval of that mean: the
seeds resampled with replacement (`RESAMPLES` = 10 000 times, from a fixed generator seed, so the same values give
the same interval), the 2.5 % and 97.5 % quantiles of the resampled means, clipped to the metric's range. A
resampled mean lies between the smallest and the largest value, so the interval never leaves the range the values
lie in (a fraction stays in [0, 1], where a Student-t interval gave "0.45 ± 0.96"); the clip to `bounds` only makes
that explicit. Ranges per metric: `BOUNDS` (`bounds_of(name)`): [0, 1] for proportions and scores of that scale
(F3, F1, precision, recall, FPR, AUROC, lap share, completion, coverage, shares of steps handed over), (-inf, 1] for
the share of misbehaviours prevented (negative where the gate adds misbehaviours), [0, inf) for non-negative figures
(MSE, CRPS, ECE, variances, seconds, rates per km), unbounded for the rest (returns and return gains, NLL, ratios
such as the return kept under a shift, which exceeds 1 when a shift helps).

**Few seeds.** A bootstrap over n seeds sees only the n values: with 3 seeds there are 10 distinct resamples, the
interval is at most the range of the three values and is narrow and optimistic (it covers the true mean less often
than 95 %; at n = 10 about 92-94 % for normal draws). Every table prints n beside its intervals; read an interval over
3 seeds as "where these seeds fell", not as a 95 % guarantee.

**Tests.** `welch` is Welch's two-sided t-test between two rows' per-seed values. A two-sided permutation test over
seeds needs no normal model but has only C(2n, n) arrangements: its smallest p is 0.1 with 3 seeds a side and 0.0079
with 5, so after a Holm correction over the tens of comparisons one table shows it could never mark a difference at
the seed counts these benchmarks run. Welch's test reaches smaller p through the normal model of the per-seed
figures (each a mean over many episodes or frames); that model is the assumption behind every `*`. A table's
comparisons are one family: `holm_marks` applies drive/metrics.py `holm` over all of them and marks only those whose
adjusted p stays below `ALPHA`; `holm_note` says how many were corrected over and which survive. An unmarked
difference is not shown to be real, whatever the means say.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

ALPHA = 0.05
LEVEL = 0.95
RESAMPLES = 10_000
SEED = 0
UNIT = (0.0, 1.0)
NON_NEGATIVE = (0.0, math.inf)
UNBOUNDED = (-math.inf, math.inf)
# metric name (the last word of a table's key: "clean laps" -> laps, "ood held-out mean" -> the OOD AUROC) -> range
BOUNDS: dict[str, tuple[float, float]] = {
    **dict.fromkeys(
        "f1 f3 precision recall fpr auroc laps completion coverage_90 coverage90_steer handed_over "
        "handed_over_benign handed_over_nominal fallback_fraction episodes_prevented".split(),
        UNIT,
    ),
    **dict.fromkeys(
        "mse mae rmse crps ece epistemic_var_steer epistemic_ratio latency_ms_p50 interventions_per_km "
        "interventions_per_km_nominal".split(),
        NON_NEGATIVE,
    ),
    "train s": NON_NEGATIVE,
    "prevented": (-math.inf, 1.0),  # 1 - misbehaviours with the gate / without: below 0 where the gate adds some
    **dict.fromkeys("return return_gain mean_return nll nll_expert_steer retained".split(), UNBOUNDED),
}
_OOD = re.compile(r"^ood ")  # `drive bench controllers`: "ood <family>" and "ood held-out mean" are AUROCs


def bounds_of(metric: str) -> tuple[float, float]:
    """The range of a metric by its name, or a table key ending in it ("clean laps", "test mse", "noise:0.2
    retained", "ood jpeg:20"); unbounded for a name not in `BOUNDS`."""
    if _OOD.match(metric):
        return UNIT
    for name in (metric, metric.rsplit(" ", 1)[-1], metric.split(" ", 1)[-1]):
        if name in BOUNDS:
            return BOUNDS[name]
    return UNBOUNDED


def interval(
    values: Sequence[float | None],
    bounds: tuple[float, float] = UNBOUNDED,
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> dict[str, Any]:
    """Mean, percentile-bootstrap interval [low, high] of the mean (None for under 2 values), sd and n of the finite
    values, clipped to `bounds` (see the module docstring: deterministic, and narrow with 3 seeds)."""
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
    if arr.size == 0:
        return {"mean": None, "low": None, "high": None, "sd": None, "n": 0, "values": []}
    lo_b, hi_b = bounds
    if arr.min() < lo_b or arr.max() > hi_b:
        raise ValueError(f"values {arr.tolist()} leave the metric's range {bounds}")
    mean = float(arr.mean())
    low = high = sd = None
    if arr.size > 1:
        sd = float(arr.std(ddof=1))
        idx = np.random.default_rng(seed).integers(0, arr.size, (resamples, arr.size))
        means = arr[idx].mean(axis=1)
        q = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
        # a resampled mean of equal values may differ from them in the last bit: keep inside the values and bounds
        low = float(np.clip(q[0], max(arr.min(), lo_b), min(arr.max(), hi_b)))
        high = float(np.clip(q[1], max(arr.min(), lo_b), min(arr.max(), hi_b)))
    return {"mean": mean, "low": low, "high": high, "sd": sd, "n": int(arr.size), "values": arr.tolist()}


def welch(a: Sequence[float | None], b: Sequence[float | None]) -> float | None:
    """Two-sided p of Welch's t-test; None when either side has fewer than 2 values or both are constant."""
    from scipy import stats

    x = np.asarray([v for v in a if v is not None and math.isfinite(v)], np.float64)
    y = np.asarray([v for v in b if v is not None and math.isfinite(v)], np.float64)
    if x.size < 2 or y.size < 2 or (x.std() == 0 and y.std() == 0):
        return None
    with warnings.catch_warnings():  # nearly equal samples (laps 1, 1, 1 against 1, 1, 0.9): scipy warns, p stands
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.ttest_ind(x, y, equal_var=False).pvalue)
    return p if math.isfinite(p) else None


def holm_marks(pvalues: Sequence[float | None], alpha: float = ALPHA) -> tuple[list[float | None], list[bool]]:
    """Holm-adjusted p (drive/metrics.py `holm`) over the family of the p-values that are not None, and which of them
    stay below `alpha`; None (no test) is adjusted to None and never marked, and does not count in the family."""
    from drive.metrics import holm

    tested = [(i, p) for i, p in enumerate(pvalues) if p is not None]
    adjusted: list[float | None] = [None] * len(pvalues)
    if tested:
        for (i, _), q in zip(tested, holm([p for _, p in tested]).tolist(), strict=True):
            adjusted[i] = float(q)
    return adjusted, [q is not None and q < alpha for q in adjusted]


def holm_note(m: int, survivors: Sequence[str], what: str = "comparisons", alpha: float = ALPHA) -> str:
    """The line under a table: how many comparisons Holm corrected over and which survive."""
    if m == 0:
        return f"No {what} tested (under 2 seeds a side, or both sides constant)."
    verb = "survives" if len(survivors) == 1 else "survive"
    kept = f"{len(survivors)} {verb}: {'; '.join(survivors)}" if survivors else "none survives"
    return f"`*`: Welch's p, Holm-corrected over the {m} {what} in this table, below {alpha}; {kept}."


def fixed(value: float, scale: float) -> str:
    """value with the decimals the magnitude of `scale` (the cell's mean) calls for: 913, 0.734, 0.0326, 3.5e-05."""
    a = abs(scale)
    for bound, decimals in ((100, 0), (10, 1), (1, 2), (0.1, 3), (0.001, 4)):
        if a >= bound:
            return f"{value:.{decimals}f}"
    return f"{value:.2g}" if a else f"{value:.3f}"


def cell_text(entry: dict[str, Any] | None) -> str:
    """'mean [low, high]' of an `interval` entry ('mean' alone for one value), ' *' when it carries
    significant=True (set by the caller from `holm_marks`); '–' when empty."""
    if entry is None or entry["mean"] is None:
        return "–"
    mean, low, high = entry["mean"], entry.get("low"), entry.get("high")
    text = fixed(mean, mean)
    if low is not None and high is not None:
        text += f" [{fixed(low, mean)}, {fixed(high, mean)}]"
    return text + (" *" if entry.get("significant") else "")
