"""The misbehaviour-prediction protocol: window arithmetic on a hand-made trace, F1/F3, Gamma thresholds, bootstrap;
its departures from the field (windows scored alike, warm-up, out-of-sample thresholds, misbehaving nominal runs)
and the null controls: a score without information sits at chance, a real one clears its nulls."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import signal, stats

from drive.metrics import average_precision, bootstrap
from drive.studies.misbehaviour.nulls import block_permuted, information_free, with_nulls
from drive.studies.misbehaviour.protocol import (
    FIELD,
    Episode,
    ProtocolConfig,
    evaluate,
    fit_threshold,
    gamma_threshold,
    misbehaviour_windows,
    nominal_windows,
    rates,
)

# The hand-made trace (fps 50, so one window = 50 steps; raw nominal scores, empirical threshold fitted in-sample,
# no warm-up: the field's window arithmetic):
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
CFG = ProtocolConfig(threshold_fit="quantile", threshold_split="in_sample", warmup_s=0.0)


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
    sma = np.array([s[max(0, t - 49) : t + 1].mean() for t in range(len(s))])  # pandas rolling(50, min_periods=1)
    nominal, shifted = Episode(s, nominal=True), Episode(s, [200])
    np.testing.assert_allclose(nominal_windows(nominal, FIELD)[0], sma[:200].reshape(4, 50).max(1))
    assert misbehaviour_windows(shifted, 1, FIELD)[0][0] == s[150:200].max()  # the field: raw on this side
    mean_cfg = ProtocolConfig(aggregate="mean", warmup_s=0.0)
    np.testing.assert_allclose(nominal_windows(nominal, mean_cfg)[0], s[:200].reshape(4, 50).mean(1))  # tail dropped
    # alike and smooth: both sides through the same trailing mean, restarted after the 1 s warm-up
    both = ProtocolConfig(smooth=True)
    late = np.array([s[max(50, t - 49) : t + 1].mean() for t in range(50, len(s))])
    np.testing.assert_allclose(nominal_windows(nominal, both)[0], late[:150].reshape(3, 50).max(1))
    assert misbehaviour_windows(shifted, 1, both)[0][0] == pytest.approx(late[100:150].max())
    with pytest.raises(ValueError, match="smooth"):
        ProtocolConfig(scoring="field", smooth=True)


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
        s[250:300] += 8.0  # the second before the onset runs hot
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
        ({"scores": np.zeros(10), "onsets": [10]}, "outside"),
        ({"scores": np.array([0.0, np.nan])}, "finite"),
        ({"scores": np.zeros(10), "busy": np.zeros(9, bool)}, "busy"),
    ],
)
def test_episode_rejects_what_the_protocol_cannot_score(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Episode(**kwargs)


ONLY_ALIKE = ProtocolConfig(threshold_split="in_sample", warmup_s=0.0)  # the field's rules but windows scored alike


def _ar1(rng: np.random.Generator, phi: float, n: int) -> np.ndarray:
    """exp(0.5 x), x a stationary Gaussian AR(1) with coefficient phi and unit variance: a positive, autocorrelated
    score; phi = 0 gives i.i.d. Gamma(2, 1) noise instead."""
    if phi == 0:
        return rng.gamma(2.0, 1.0, n)
    x0 = rng.normal()  # the step before the first, drawn from the stationary N(0, 1)
    x = signal.lfilter([np.sqrt(1 - phi * phi)], [1.0, -phi], rng.normal(size=n), zi=[phi * x0])[0]
    return np.exp(0.5 * x)


def _noise_episodes(rng: np.random.Generator, n_nominal: int = 20, n_shifted: int = 40, phi: float = 0.0) -> list:
    """An information-free score: the same distribution (i.i.d. Gamma noise, or `_ar1`) in n_nominal nominal and
    n_shifted shifted episodes of 500 steps at 50 frames/s, each shifted one with a misbehaviour at step 300."""
    nominal = [Episode(_ar1(rng, phi, 500), nominal=True) for _ in range(n_nominal)]
    shifted = [Episode(_ar1(rng, phi, 500), onsets=(300,)) for _ in range(n_shifted)]
    return nominal + shifted


def test_the_fields_asymmetric_windows_let_noise_pass_and_alike_windows_do_not():
    """What docs/misbehaviour.md warns of: with the field's scoring (nominal windows on a 1 s trailing mean,
    misbehaviour windows on the raw maximum) a score carrying no information looks like a near-perfect predictor;
    scored alike on both sides it sits at chance."""
    episodes = _noise_episodes(np.random.default_rng(0))
    field = {r.ttm: r for r in evaluate(episodes, FIELD, levels=(0.999,), ttms=(2,), n_boot=2)}[2]
    alike = {r.ttm: r for r in evaluate(episodes, ONLY_ALIKE, levels=(0.999,), ttms=(2,), n_boot=2)}[2]
    assert field.value.recall > 0.9 and field.value.f3 > 0.9 and field.value.auroc > 0.95
    assert alike.value.f3 < 0.2 and abs(alike.value.auroc - 0.5) < 0.1


def test_the_inflation_figures_quoted_in_the_protocols_docstring():
    """drive/studies/misbehaviour/protocol.py, departure 1: the figures of the field's rules and of windows scored alike
    (level 0.999, TTM 2) on i.i.d. Gamma noise and on exp(0.5 x), x an AR(1) with phi 0.5, 20 + 40 episodes, seed 0."""
    quoted = {0.0: ((1.00, 0.99, 1.000), (0.03, 0.49)), 0.5: ((1.00, 0.99, None), (0.03, None))}
    for phi, ((recall, f3, auroc), (alike_f3, alike_auroc)) in quoted.items():
        episodes = _noise_episodes(np.random.default_rng(0), phi=phi)
        field = evaluate(episodes, FIELD, levels=(0.999,), ttms=(2,), n_boot=1)[0].value
        alike = evaluate(episodes, ONLY_ALIKE, levels=(0.999,), ttms=(2,), n_boot=1)[0].value
        assert (round(field.recall, 2), round(field.f3, 2), round(alike.f3, 2)) == (recall, f3, alike_f3), phi
        if auroc is not None:
            assert (round(field.auroc, 3), round(alike.auroc, 2)) == (auroc, alike_auroc)


@pytest.mark.parametrize("phi", [0.0, 0.5, 0.9, 0.98])
def test_an_information_free_score_sits_at_chance_with_the_defaults(phi):
    """The same score distribution on both sides (white Gamma noise, or a positive AR(1) score), 40 nominal and 80
    shifted episodes, seeds 0-19 (not picked; one seed's AUROC has sd 0.04, the mean of 20 about 0.01): with the
    defaults the mean F3 over seeds stays <= 0.1 at every level from 0.99 and every TTM, and the mean AUROC within
    0.5 +- 0.05. (At level 0.95 a chance score's F3 is itself near 0.1: passing a share p of windows on both sides
    gives F3 = p / (0.9 + 0.55 p) here, 0.054 at p = 0.05.)"""
    levels = (0.99, 0.999, 0.9999, 0.99999)
    rows = [evaluate(_noise_episodes(np.random.default_rng(seed), 40, 80, phi), levels=levels, n_boot=1)
            for seed in range(20)]  # fmt: skip
    f3 = np.mean([[r.value.f3 for r in by_seed] for by_seed in rows], 0)  # (levels x TTMs,)
    auroc = np.mean([[r.value.auroc for r in by_seed] for by_seed in rows], 0)
    assert (f3 <= 0.1).all(), f3
    assert (np.abs(auroc - 0.5) <= 0.05).all(), auroc


def _ramped(rng: np.random.Generator, start: int) -> np.ndarray:
    s = rng.gamma(2.0, 1.0, 500)
    s[start : start + 150] += np.linspace(0.0, 12.0, 150)  # a 3 s rise
    return s


def test_a_real_signal_clears_its_nulls_and_its_block_permuted_null_sits_at_chance():
    """Every run holds one 3 s rise of the score; on shifted runs it ends at the onset, on nominal runs it comes at
    a random second. Only its timing tells: the monitor ranks misbehaviour windows high, its block-permuted null
    (the same values, the alignment gone) sits at chance and so does the information-free one."""
    rng = np.random.default_rng(0)
    episodes = [Episode(_ramped(rng, 50 * int(rng.integers(1, 7))), nominal=True) for _ in range(40)]
    episodes += [Episode(_ramped(rng, 150), onsets=(300,)) for _ in range(80)]
    got = with_nulls(episodes, levels=(0.999,), ttms=(1, 2), n_boot=100, seed=0)
    for row, flags, permuted, free in zip(got.rows, got.clears, *got.nulls.values(), strict=True):
        assert row.value.auroc > 0.8 and flags.auroc, row.ttm
        assert abs(permuted.value.auroc - 0.5) < 0.08 and abs(free.value.auroc - 0.5) < 0.08, row.ttm
    assert list(got.nulls) == ["block_permuted", "information_free"]


def test_a_score_merely_hotter_on_shifted_runs_does_not_clear_its_block_permuted_null():
    """Shifted runs 1.5 times hotter throughout, with no timing: a high AUROC that the information-free null does
    not explain and the block-permuted null does (it keeps each run's values)."""
    rng = np.random.default_rng(1)
    episodes = [Episode(rng.gamma(2.0, 1.0, 500), nominal=True) for _ in range(40)]
    episodes += [Episode(rng.gamma(2.0, 1.5, 500), onsets=(300,)) for _ in range(80)]
    got = with_nulls(episodes, levels=(0.999,), ttms=(2,), n_boot=100, seed=0)
    row, permuted, free = got.rows[0], got.nulls["block_permuted"][0], got.nulls["information_free"][0]
    assert row.value.auroc > 0.8 and permuted.value.auroc > 0.8 and abs(free.value.auroc - 0.5) < 0.1
    assert not got.clears[0].auroc and row.low.auroc > free.high.auroc


def test_nulls_keep_labels_and_draw_what_they_say():
    rng = np.random.default_rng(2)
    busy = np.zeros(430, bool)
    busy[300:320] = True
    episodes = [Episode(rng.gamma(2.0, 1.0, 430), nominal=True), Episode(rng.gamma(2.0, 1.0, 430), [300], busy=busy)]
    for ep, null in zip(episodes, block_permuted(episodes, np.random.default_rng(0)), strict=True):
        assert (null.onsets, null.nominal) == (ep.onsets, ep.nominal) and (null.busy == ep.busy).all()
        assert (null.scores[:50] == ep.scores[:50]).all()  # the warm-up stays where it is
        np.testing.assert_array_equal(np.sort(null.scores), np.sort(ep.scores))
        tail = ep.scores[50:]
        blocks = [tail[k : k + 50] for k in range(0, len(tail), 50)]  # 7 whole blocks and one of 30 steps
        assert any((null.scores[50 + k : 50 + k + 30] == blocks[-1]).all() for k in range(0, 351, 50))
        assert not (null.scores == ep.scores).all()
    free = information_free(episodes, np.random.default_rng(0))
    pool = set(episodes[0].scores[50:])
    assert all(set(e.scores) <= pool for e in free) and free[1].onsets == (300,)


def test_thresholds_count_false_positives_out_of_sample():
    """Nominal runs 1st and 3rd score 1-2, runs 2nd and 4th 100-200: with halves the threshold fitted on the low
    half counts every window of the high half as a false positive and the high half's threshold none of the low
    half's; in-sample, the 0.8 quantile of all 20 windows passes exactly 3 of them. The misbehaviour window (50)
    passes the low half's threshold and not the high half's: TP 0.5, FN 0.5. The bootstrap keeps the halves apart:
    every replicate has FPR 0.5."""
    rng = np.random.default_rng(3)
    nominal = [Episode(rng.uniform(*((100, 200) if k % 2 else (1, 2)), 300), nominal=True) for k in range(4)]
    shifted = Episode(np.r_[np.zeros(200), np.full(50, 50.0), np.zeros(50)], [250])
    cfg = ProtocolConfig(threshold_fit="quantile")
    out = evaluate([*nominal, shifted], cfg, levels=[0.8], ttms=[1], n_boot=50)[0]
    assert (out.value.fp, out.value.tn, out.value.fpr) == (10, 10, 0.5)  # 4 runs x 5 windows after the warm-up
    assert (out.value.tp, out.value.fn) == (0.5, 0.5)
    assert out.low.fpr == out.high.fpr == 0.5
    inside = evaluate([*nominal, shifted], ProtocolConfig(threshold_fit="quantile", threshold_split="in_sample"),
                      levels=[0.8], ttms=[1], n_boot=5)[0]  # fmt: skip
    assert (inside.value.fp, inside.value.tn, inside.value.tp) == (3, 17, 0)
    with pytest.raises(ValueError, match="too few nominal windows"):
        evaluate([nominal[0], shifted], cfg, levels=[0.8], ttms=[1], n_boot=5)  # one run: no two halves


def test_the_reset_transient_is_not_scored():
    """A spike in the first second of every nominal run changes nothing with the default 1 s warm-up; without it the
    spikes (1 window in 10) become the threshold at level 0.95 and nothing reaches it. A misbehaviour window reaching
    into the warm-up is not scorable (before_start)."""
    rng = np.random.default_rng(4)
    quiet = [rng.gamma(2.0, 1.0, 500) for _ in range(10)]
    spiked = [np.r_[s[:10], 1e3, s[11:]] for s in quiet]
    shifted = [Episode(rng.gamma(2.0, 1.0, 500), [300]) for _ in range(6)] + [Episode(rng.gamma(2.0, 1.0, 500), [90])]
    cfg = ProtocolConfig(threshold_fit="quantile")

    def run(scores: list[np.ndarray], cfg: ProtocolConfig) -> list:
        return evaluate([Episode(s, nominal=True) for s in scores] + shifted, cfg, levels=[0.95], n_boot=5)

    assert run(spiked, cfg) == run(quiet, cfg)
    by_ttm = {r.ttm: r for r in run(quiet, cfg)}
    assert [by_ttm[t].before_start for t in (1, 2, 3)] == [1, 1, 1]  # [40, 90) starts inside the warm-up
    no_warmup = ProtocolConfig(threshold_fit="quantile", warmup_s=0.0)
    inflated, plain = run(spiked, no_warmup)[0].value, run(quiet, no_warmup)[0].value
    assert inflated.threshold == 1e3 and inflated.tp == 0 < plain.tp
    assert {r.ttm: r.before_start for r in run(quiet, no_warmup)} == {1: 0, 2: 1, 3: 1}


def test_a_misbehaving_nominal_run_stays_in_and_its_misbehaviour_is_left_out():
    """A nominal run leaving the road at step 300 (busy to 400, the score huge there): its windows in the 3 s before
    the onset and during the misbehaviour (150-400: 5 windows) are left out and counted, its other 4 scored; its
    onset is no TP or FN."""
    rng = np.random.default_rng(5)
    nominal = [Episode(rng.gamma(2.0, 1.0, 500), nominal=True) for _ in range(6)]
    shifted = [Episode(rng.gamma(2.0, 1.0, 500), [300]) for _ in range(6)]
    scores = rng.gamma(2.0, 1.0, 500)
    busy = np.zeros(500, bool)
    busy[300:400] = True
    hot = np.where(busy, 1e3, scores)
    plain = evaluate([*nominal, Episode(scores, nominal=True), *shifted], levels=[0.99], ttms=[1], n_boot=5)[0]
    kept = evaluate([*nominal, Episode(hot, [300], nominal=True, busy=busy), *shifted], levels=[0.99], ttms=[1],
                    n_boot=5)[0]  # fmt: skip
    assert kept.nominal_left_out == 5 and plain.nominal_left_out == 0
    assert kept.value.fp + kept.value.tn == plain.value.fp + plain.value.tn - 5 == 7 * 9 - 5
    assert kept.value.tp + kept.value.fn == plain.value.tp + plain.value.fn == 6
    windows, left = nominal_windows(Episode(hot, [300], nominal=True, busy=busy), ProtocolConfig())
    assert left == 5 and windows.max() < 1e3


def test_any_level_in_the_open_unit_interval_and_any_whole_ttm_is_scored():
    episodes = _noise_episodes(np.random.default_rng(6))
    rows = evaluate(episodes, levels=[0.97], ttms=[4], n_boot=2)
    assert [(r.level, r.ttm) for r in rows] == [(0.97, 4)] and rows[0].value.tp + rows[0].value.fn == 40
    for levels, ttms in (([1.0], [1]), ([0.99], [0]), ([0.99], [1.5])):
        with pytest.raises(ValueError, match="levels must lie in"):
            evaluate(episodes, levels=levels, ttms=ttms, n_boot=2)
