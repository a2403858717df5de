"""drive/studies/over_seeds.py: bootstrap intervals over seeds that stay in the metric's range and cover about as
often as they say, Holm over a table's comparisons, and tables that star only the comparisons that survive it."""

from __future__ import annotations

import numpy as np
import pytest

from drive.studies.controllers.text import _table
from drive.studies.over_seeds import (
    UNBOUNDED,
    UNIT,
    bounds_of,
    cell_text,
    holm_marks,
    holm_note,
    interval,
    welch,
)


@pytest.mark.parametrize(
    "values", [[0.0, 0.45, 0.9], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0], [0.311, 0.0, 0.622], [0.999, 1.0, 0.998], [0.5] * 3]
)
def test_an_interval_of_fractions_stays_in_0_1(values):
    """The spreads a Student-t interval printed as "0.45 ± 0.96" (from -0.51 to 1.41): inside [0, 1] now."""
    out = interval(values, UNIT)
    assert 0.0 <= out["low"] <= out["mean"] <= out["high"] <= 1.0
    assert min(values) <= out["low"] and out["high"] <= max(values)  # a resampled mean is within the values
    assert out["n"] == 3 and out["values"] == values


def test_a_wide_spread_of_fractions_never_leaves_0_1_on_random_draws():
    rng = np.random.default_rng(3)
    for _ in range(200):
        values = rng.choice([0.0, 1.0, rng.uniform()], size=int(rng.integers(2, 8))).tolist()
        out = interval(values, UNIT, resamples=500)
        assert 0.0 <= out["low"] <= out["mean"] <= out["high"] <= 1.0


def test_the_interval_is_deterministic_and_values_outside_the_range_are_an_error():
    values = [0.2, 0.7, 0.4, 0.9, 0.1]
    assert interval(values, UNIT) == interval(values, UNIT)  # a fixed generator seed: the same table every rebuild
    odd = np.random.default_rng(1).uniform(size=6).tolist()
    assert interval(odd, UNIT, resamples=300, seed=1) != interval(odd, UNIT, resamples=300)  # the seed fixes it
    with pytest.raises(ValueError, match="range"):
        interval([0.5, 1.2], UNIT)
    assert interval([-50.0, 900.0], UNBOUNDED)["low"] == pytest.approx(-50.0)  # returns: no range
    assert interval([7.0])["low"] is None and interval([None, float("nan")])["n"] == 0


def test_the_interval_covers_the_true_mean_about_95_percent_of_the_time_at_ten_seeds():
    """Beta(2, 5) draws (mean 2/7, a skewed fraction), n = 10: a percentile bootstrap of the mean covers a little
    under its nominal 95 % (it uses the plug-in spread): about 0.92 here; seeded, so the count is fixed."""
    rng = np.random.default_rng(0)
    draws = 400
    covered = sum(
        (iv := interval(rng.beta(2, 5, 10).tolist(), UNIT, resamples=2000))["low"] <= 2 / 7 <= iv["high"]
        for _ in range(draws)
    )
    assert 0.88 <= covered / draws <= 0.98, covered / draws


def test_metric_ranges():
    assert (
        bounds_of("f3") == bounds_of("clean laps") == bounds_of("ood held-out mean") == bounds_of("ood jpeg:90") == UNIT
    )
    assert bounds_of("clean return") == bounds_of("noise:0.2 retained") == bounds_of("test nll") == UNBOUNDED
    assert bounds_of("test mse")[0] == 0.0 and bounds_of("prevented") == (-np.inf, 1.0)


def test_holm_lets_almost_no_null_comparison_through_and_a_large_difference_survives():
    """40 comparisons of equal distributions at 5 seeds a side: uncorrected, about 2 would be starred; after Holm
    the family-wise error is 5 %, so over 20 such tables at most a couple get any star. One real difference of 5 sd
    among them survives."""
    rng = np.random.default_rng(7)
    starred_raw = starred_holm = 0
    for _ in range(20):
        ps = [welch(rng.normal(0, 1, 5).tolist(), rng.normal(0, 1, 5).tolist()) for _ in range(40)]
        adjusted, marks = holm_marks(ps)
        starred_raw += sum(p is not None and p < 0.05 for p in ps)
        starred_holm += sum(marks)
        assert all(q is not None and q >= p for p, q in zip(ps, adjusted, strict=True))
    assert starred_raw >= 20 and starred_holm <= 2, (starred_raw, starred_holm)
    ps = [welch(rng.normal(0, 1, 5).tolist(), rng.normal(0, 1, 5).tolist()) for _ in range(40)]
    ps.append(welch(rng.normal(0, 1, 5).tolist(), rng.normal(5, 1, 5).tolist()))
    _, marks = holm_marks(ps)
    assert marks[-1] and sum(marks) <= 2
    assert holm_marks([None, 0.01, None]) == ([None, 0.01, None], [False, True, False])  # no test: not in the family


def test_cells_print_mean_and_interval_and_the_star_they_are_given():
    entry = interval([0.0, 0.45, 0.9], UNIT)
    assert cell_text(entry) == "0.450 [0.000, 0.900]" and cell_text(entry | {"significant": True}).endswith("] *")
    assert cell_text(interval([913.1])) == "913" and cell_text(None) == "–"
    assert holm_note(3, ["a f3"], "comparisons").endswith("3 comparisons in this table, below 0.05; 1 survives: a f3.")


def test_a_controllers_table_stars_only_the_comparisons_that_survive_holm():
    """Row `near` differs from the reference at an uncorrected p just under 0.05 in each of 10 metrics, row `far`
    by a wide margin in one: 20 comparisons in the table, only `far`'s survives (and is the only `*`), though
    results.json marks every uncorrected p < 0.05 significant."""
    ref = {f"m{k}": [0.0, 0.1, 0.2] for k in range(10)}
    near = {f"m{k}": [0.3, 0.35, 0.4] for k in range(10)}
    far = {f"m{k}": ([5.0, 5.1, 5.2] if k == 0 else [0.0, 0.1, 0.2]) for k in range(10)}
    rows: dict = {"ref": {m: interval(v) for m, v in ref.items()}}
    for name, by in (("near", near), ("far", far)):
        rows[name] = {}
        for m, v in by.items():
            p = welch(v, ref[m])
            rows[name][m] = interval(v) | {"p_vs_reference": p, "significant": p is not None and p < 0.05}
    assert 0.01 < rows["near"]["m0"]["p_vs_reference"] < 0.05 and rows["near"]["m0"]["significant"]
    lines = _table({"rows": rows, "reference": "ref"}, [(f"m{k}", f"m{k}") for k in range(10)])
    stars = [(line.split(" | ")[0], line.count(" *")) for line in lines if line.startswith("| ")]
    assert stars == [("| row", 0), ("| ref", 0), ("| near", 0), ("| far", 1)]
    assert "far | 3 | 5.10 [5.00, 5.20] *" in "\n".join(lines)
    assert lines[-1].endswith("over the 20 comparisons with `ref` in this table, below 0.05; 1 survives: far m0.")
