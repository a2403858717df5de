"""Statistics over training seeds, shared by the benchmarks that train several seeds of each controller
(`drive bench controllers`, `drive bench misbehaviour`): the mean with the half-width of a 95 % Student-t interval
(t_{0.975, n-1} s / sqrt(n)), Welch's two-sided t-test between two rows, and the "mean ± half *" text of a cell.
With 3 seeds a t-interval is wide (t_{0.975, 2} = 4.30): a difference the test does not mark is not shown to be real.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np


def interval(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean, 95 % Student-t half-width (None for one value), sd and n of the finite values."""
    from scipy import stats

    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
    if arr.size == 0:
        return {"mean": None, "half_width": None, "sd": None, "n": 0, "values": []}
    sd = float(arr.std(ddof=1)) if arr.size > 1 else None
    half = float(stats.t.ppf(0.975, arr.size - 1) * sd / math.sqrt(arr.size)) if sd is not None else None
    return {"mean": float(arr.mean()), "half_width": half, "sd": sd, "n": int(arr.size), "values": arr.tolist()}


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


def fixed(value: float, scale: float) -> str:
    """value with the decimals the magnitude of `scale` (the cell's mean) calls for: 913, 0.734, 0.0326, 3.5e-05."""
    a = abs(scale)
    for bound, decimals in ((100, 0), (10, 1), (1, 2), (0.1, 3), (0.001, 4)):
        if a >= bound:
            return f"{value:.{decimals}f}"
    return f"{value:.2g}" if a else f"{value:.3f}"


def cell_text(entry: dict[str, Any] | None) -> str:
    """'mean ± half-width' of an `interval` entry, ' *' when it carries significant=True; '–' when empty."""
    if entry is None or entry["mean"] is None:
        return "–"
    mean, half = entry["mean"], entry["half_width"]
    text = fixed(mean, mean) + (f" ± {fixed(half, mean)}" if half is not None else "")
    return text + (" *" if entry.get("significant") else "")
