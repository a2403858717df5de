"""The misbehaviour-prediction protocol: window arithmetic on a hand-made trace, F1/F3, Gamma thresholds, bootstrap."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from drive.metrics import average_precision, bootstrap
from drive.studies.protocol import (
    Episode,
    ProtocolConfig,
    evaluate,
    fit_threshold,
    gamma_threshold,
    misbehaviour_windows,
    nominal_windows,
    rates,
)

# The hand-made trace (fps 50, so one window = 50 steps; raw nominal scores, empirical threshold):
# nominal, 500 steps = 10 windows with max 5.0, 1.1, 1.2, ..., 1.9 -> at level 0.8 the "higher" quantile of the 10
#   aggregates is the 9th smallest, t = 1.9: FP = 1 (the 5.0 window, > t), TN = 9.
# A, 400 steps, onsets 120 and 300 (busy 120-139, 300-319), score 0.5, 2.5 at step 90:
#   TTM 1: 120 -> [70, 120) holds 2.5 >= t: TP;  300 -> [250, 300) max 0.5: FN (labelled frames in [250, 300]: 1)
#   TTM 2: 120 -> [20, 70): FN;  300 -> [200, 250): FN
#   TTM 3: 120 -> would start at -30: before_start;  300 -> [150, 200): FN
# B, 300 steps, onsets 100 and 130 (busy 100-124, 130-139), score 0.5, 3.0 at step 60:
#   TTM 1: 100 -> [50, 100) holds 3.0: TP;  130 -> [80, 130] holds B100's window and busy steps (> 2): overlap
#   TTM 2: 100 -> [0, 50): FN;  130 -> [30, 80] holds B100's window 30..50: overlap
#   TTM 3: 100 and 130 start before step 0: before_start x 2
# C, 300 steps, onsets 100 and 110 (busy 100-129), score 0.5: 110 comes while 100 is on -> merged (every TTM)
#   TTM 1: 100 -> [50, 100): FN;  TTM 2: [0, 50): FN;  TTM 3: before_start
# Totals    TP FN FP TN before overlap merged
#   TTM 1    2  2  1  9      0       1      1
#   TTM 2    0  4  1  9      0       1      1
#   TTM 3    0  1  1  9      4       0      1
# Lead times at t = 1.9 (horizon 150 steps, busy steps skipped): A120 90 -> 0.6 s, B100 60 -> 0.8 s, B130 60 ->
#   1.4 s, A300 and C100 never cross: median 0.8 s.
# TTM 1 windows for AUROC: positive 2.5, 0.5, 3.0, 0.5 against negative 5.0, 1.1..1.9: 2.5 and 3.0 beat 9 of 10,
#   AUROC = 18 / 40 = 0.45; AP = 0.25 * 1/2 + 0.25 * 2/3 + 0.5 * 4/14.
HAND = {1: (2, 2, 1, 9, 0, 1, 1), 2: (0, 4, 1, 9, 0, 1, 1), 3: (0, 1, 1, 9, 4, 0, 1)}
CFG = ProtocolConfig(threshold_fit="quantile", smooth_nominal=False)


def _busy(n: int, *spans: tuple[int, int]) -> np.ndarray:
    busy = np.zeros(n, bool)
    for a, b in spans:
        busy[a:b] = True
    return busy


def _trace() -> list[Episode]:
    nominal = np.repeat(np.round(np.arange(1.0, 1.95, 0.1), 1), 50)  # window k holds 1.0 + 0.1 k
    nominal[10] = 5.0  # window 0's max
    a, b, c = np.full(400, 0.5), np.full(300, 0.5), np.full(300, 0.5)
    a[90], b[60] = 2.5, 3.0
    return [
        Episode(nominal, nominal=True),
        Episode(a, [120, 300], busy=_busy(400, (120, 140), (300, 320))),
        Episode(b, [100, 130], busy=_busy(300, (100, 125), (130, 140))),
        Episode(c, [100, 110], busy=_busy(300, (100, 130))),
    ]


def test_hand_made_trace_counts_at_every_ttm():
    rows = {r.ttm: r for r in evaluate(_trace(), CFG, levels=[0.8], n_boot=20, seed=1)}
    for ttm, (tp, fn, fp, tn, before, overlap, merged) in HAND.items():
        row = rows[ttm]
        assert row.value.threshold == pytest.approx(1.9)
        assert (row.value.tp, row.value.fn, row.value.fp, row.value.tn) == (tp, fn, fp, tn), ttm
        assert (row.before_start, row.overlap, row.merged) == (before, overlap, merged), ttm
    one = rows[1].value
    assert (one.precision, one.recall, one.fpr) == pytest.approx((2 / 3, 0.5, 0.1))
    assert (one.f1, one.f3) == pytest.approx((4 / 7, 2 / 3.9))
    assert one.median_lead_s == pytest.approx(0.8)
    assert one.auroc == pytest.approx(0.45)
    assert one.auprc == pytest.approx(0.25 / 2 + 0.25 * 2 / 3 + 0.5 * 4 / 14)
    assert rows[2].value.precision == 0  # TP 0, FP 1: defined, zero
    assert rows[2].value.f3 == 0


def test_window_edges_one_frame_apart():
    # TTM 1 at onset 100 is [50, 100): a spike at 49 belongs to TTM 2's window, a spike at 99 to TTM 1's.
    for step, ttm in ((49, 2), (50, 1), (99, 1)):
        s = np.zeros(200)
        s[step] = 1.0
        ep = Episode(s, [100])
        hits = {t: misbehaviour_windows(ep, t, CFG)[0][0] for t in (1, 2)}
        assert hits == {t: float(t == ttm) for t in (1, 2)}, step


def test_tp_uses_at_least_and_fp_strictly_above_the_threshold():
    nominal = Episode(np.repeat([1.0, 2.0, 3.0, 4.0], 50), nominal=True)
    shifted = Episode(np.r_[np.full(50, 3.0), np.zeros(50)], [50])
    row = evaluate([nominal, shifted], CFG, levels=[0.6], ttms=[1], n_boot=5)[0]  # "higher" quantile: t = 3.0
    assert row.value.threshold == 3.0 and (row.value.tp, row.value.fp) == (1, 1)  # 3.0 >= t; only 4.0 > t


def test_nominal_smoothing_is_a_trailing_mean_with_min_periods_one():
    s = np.random.default_rng(0).gamma(2.0, 1.0, 230)
    cfg = ProtocolConfig(smooth_nominal=True)
    sma = np.array([s[max(0, t - 49) : t + 1].mean() for t in range(len(s))])  # pandas rolling(50, min_periods=1)
    np.testing.assert_allclose(nominal_windows(s, cfg), sma[:200].reshape(4, 50).max(1))
    mean_cfg = ProtocolConfig(smooth_nominal=False, aggregate="mean")
    np.testing.assert_allclose(nominal_windows(s, mean_cfg), s[:200].reshape(4, 50).mean(1))  # the tail dropped


def test_f1_and_f3_on_known_counts_equal_f_beta():
    precision, recall, fpr, accuracy, f1, f3 = rates(tp=8, fn=2, fp=10, tn=90)
    assert (precision, recall, fpr, accuracy) == pytest.approx((8 / 18, 0.8, 0.1, 98 / 110))
    assert f3 == pytest.approx(8 / (8 + 0.1 * 10 + 0.9 * 2)) == pytest.approx(10 * 8 / (10 * 8 + 9 * 2 + 10))
    f_beta = lambda b: (1 + b * b) * precision * recall / (b * b * precision + recall)  # noqa: E731
    assert (f1, f3) == pytest.approx((f_beta(1), f_beta(3)))
    assert all(np.isnan(rates(0, 0, 0, 0)))


def test_gamma_threshold_recovers_the_true_ppf():
    errors = stats.gamma.rvs(2.0, scale=0.5, size=5000, random_state=np.random.default_rng(3))
    fitted = gamma_threshold(errors, [0.99])[0]
    assert fitted == pytest.approx(stats.gamma.ppf(0.99, 2.0, scale=0.5), rel=0.03)
    with_zeros = gamma_threshold(np.r_[errors, np.zeros(100)], [0.99])[0]  # the field drops zero errors
    assert with_zeros == pytest.approx(fitted)
    assert fit_threshold(errors, [0.5], "quantile")[0] in errors
    with pytest.raises(ValueError, match="non-negative"):
        gamma_threshold(np.r_[errors, -1.0], [0.99])
    # no signal (a controller without an epistemic term: every nominal score 0): no Gamma, a threshold above them all
    flat = gamma_threshold(np.zeros(50), [0.95, 0.99])
    assert (flat > 0).all() and (flat < 1e-300).all()
    assert gamma_threshold(np.full(9, 0.25), [0.99])[0] == np.nextafter(0.25, 1)


def test_bootstrap_constant_statistic_has_zero_width():
    low, high = bootstrap(lambda i: 3.0, [10], n_boot=200, seed=0)
    assert low == high == 3.0


def test_bootstrap_interval_of_a_mean_covers_it():
    rng = np.random.default_rng(7)
    covered = 0
    for k in range(50):  # the 95 % interval of a mean covers the true mean in about 95 % of simulated data sets
        x = rng.normal(2.0, 1.0, 100)
        low, high = bootstrap(lambda i, x=x: x[i].mean(), [len(x)], n_boot=400, seed=k)
        covered += int(low < 2.0 < high)
    assert 44 <= covered <= 50, covered  # Binomial(50, 0.95): 44 is 2.4 sd below the mean
    x = rng.normal(2.0, 1.0, 400)
    low, high = bootstrap(lambda i: x[i].mean(), [len(x)], n_boot=1000, seed=0)
    assert high - low == pytest.approx(2 * 1.96 / 20, rel=0.2)  # the normal-theory width, 2 z sd / sqrt(n)
    assert bootstrap(lambda i: x[i].mean(), [len(x)], n_boot=50, seed=4) == bootstrap(
        lambda i: x[i].mean(), [len(x)], n_boot=50, seed=4
    )


def test_bootstrap_resamples_strata_apart():
    seen: list[tuple[int, int]] = []
    bootstrap(lambda a, b: seen.append((len(a), int(b.max()))) or 0.0, [3, 5], n_boot=30)
    assert {n for n, _ in seen} == {3} and max(m for _, m in seen) <= 4


def test_evaluate_intervals_bracket_the_value_and_are_seeded():
    rng = np.random.default_rng(11)
    episodes = [Episode(rng.gamma(2.0, 1.0, 300), nominal=True) for _ in range(6)]
    for _ in range(6):
        s = rng.gamma(2.0, 1.0, 400)
        s[250:300] += 4.0  # the second before the onset runs hot
        episodes.append(Episode(s, [300]))
    rows = evaluate(episodes, levels=[0.95, 0.99], ttms=[1, 2], n_boot=100, seed=5)
    assert [(r.level, r.ttm) for r in rows] == [(0.95, 1), (0.95, 2), (0.99, 1), (0.99, 2)]
    first = rows[0]
    assert first.value.recall == 1.0 and first.low.recall == 1.0 and first.value.auroc > 0.9
    assert first.low.fpr <= first.value.fpr <= first.high.fpr
    assert rows == evaluate(episodes, levels=[0.95, 0.99], ttms=[1, 2], n_boot=100, seed=5)


def test_average_precision_matches_its_definition_with_ties():
    # descending: 0.9 (+), 0.8 (-), 0.5 (+, -) tied -> P = 1, 1/2, 2/4 at R = 1/2, 1/2, 1: AP = 1/2 + 1/2 * 1/2
    assert average_precision(np.array([0.9, 0.5]), np.array([0.8, 0.5])) == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scores": np.zeros(10), "onsets": [3], "nominal": True}, "nominal episode has no misbehaviour"),
        ({"scores": np.zeros(10), "onsets": [10]}, "outside"),
        ({"scores": np.array([0.0, np.nan])}, "finite"),
        ({"scores": np.zeros(10), "busy": np.zeros(9, bool)}, "busy"),
    ],
)
def test_episode_rejects_what_the_protocol_cannot_score(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Episode(**kwargs)
