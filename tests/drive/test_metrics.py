"""Every metric in drive/metrics.py against a reference (scoringrules, scipy) or a value computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scoringrules as sr
import torch
from scipy import stats

from agents.base import Prediction
from drive import metrics

RNG = np.random.default_rng(1234)
Y = RNG.normal(size=(40, 3))
MEAN = Y + RNG.normal(scale=0.7, size=(40, 3))
STD = RNG.uniform(0.2, 2.0, size=(40, 3))
SAMPLES = MEAN[None] + STD[None] * RNG.normal(size=(9, 40, 3))  # (S, B, D)


def test_point_errors_by_hand():
    mean, y = np.array([1.0, 2.0, 4.0]), np.array([0.0, 2.0, 1.0])
    assert metrics.mse(mean, y) == pytest.approx(10 / 3)
    assert metrics.mae(mean, y) == pytest.approx(4 / 3)
    assert metrics.rmse(mean, y) == pytest.approx(math.sqrt(10 / 3))


def test_gaussian_nll_matches_scipy_and_hand_value():
    assert metrics.gaussian_nll(0.0, 1.0, 0.0) == pytest.approx(0.5 * math.log(2 * math.pi))
    expected = -np.mean(stats.norm.logpdf(Y, MEAN, STD))
    assert metrics.gaussian_nll(MEAN, STD**2, Y) == pytest.approx(expected, rel=1e-12)


def test_crps_gaussian_matches_scoringrules():
    expected = np.mean(sr.crps_normal(Y, MEAN, STD))
    assert metrics.crps_gaussian(MEAN, STD**2, Y) == pytest.approx(expected, rel=1e-10)
    # hand value: CRPS(N(0, 1), 0) = 2 phi(0) - 1/sqrt(pi) = sqrt(2/pi) - 1/sqrt(pi)
    assert metrics.crps_gaussian(0.0, 1.0, 0.0) == pytest.approx(math.sqrt(2 / math.pi) - 1 / math.sqrt(math.pi))


@pytest.mark.parametrize(("estimator", "fair"), [("nrg", False), ("qd", False), ("fair", True), ("pwm", True)])
def test_crps_ensemble_matches_scoringrules(estimator, fair):
    expected = np.mean(sr.crps_ensemble(Y, SAMPLES, m_axis=0, estimator=estimator))
    assert metrics.crps_ensemble(SAMPLES, Y, fair=fair) == pytest.approx(expected, rel=1e-10)


def test_crps_ensemble_by_hand_and_converges_to_closed_form():
    # samples {0, 2}, y = 0: E|X - y| = 1, E|X - X'| = (0 + 2 + 2 + 0) / 4 = 1 -> CRPS = 1 - 0.5 = 0.5
    assert metrics.crps_ensemble(np.array([[0.0], [2.0]]), np.array([0.0])) == pytest.approx(0.5)
    draws = np.random.default_rng(0).normal(0.3, 1.5, size=(20000, 1))
    assert metrics.crps_ensemble(draws, np.array([1.0]), fair=True) == pytest.approx(
        metrics.crps_gaussian(0.3, 1.5**2, 1.0), rel=0.02
    )


def test_pit_by_hand():
    z975 = stats.norm.ppf(0.975)
    np.testing.assert_allclose(metrics.pit([0.0, 1.0], [1.0, 4.0], [0.0, 1.0 + 2 * z975]), [0.5, 0.975])


def test_pit_wasserstein_by_hand_and_against_scipy():
    assert metrics.pit_wasserstein([0.5]) == pytest.approx(0.25)
    assert metrics.pit_wasserstein([0.25, 0.75]) == pytest.approx(0.125)
    assert metrics.pit_wasserstein([0.0, 1.0]) == pytest.approx(0.25)
    u = RNG.uniform(size=500) ** 2  # a miscalibrated PIT
    reference = stats.wasserstein_distance(u, np.linspace(0, 1, 400_001))
    assert metrics.pit_wasserstein(u) == pytest.approx(reference, abs=1e-5)
    with pytest.raises(ValueError, match="PIT values"):
        metrics.pit_wasserstein([1.5])


def test_ece_by_hand_and_calibrated_forecast():
    # every PIT = 0.5: observed frequency 0 below level 0.5, 1 from 0.5 on -> (2.25 + 0.5 + 2.25) / 19
    assert metrics.ece(np.zeros(10), np.ones(10), np.zeros(10)) == pytest.approx(5.0 / 19)
    y = np.random.default_rng(3).normal(2.0, 3.0, size=200_000)
    assert metrics.ece(2.0, 9.0, y) < 0.003
    assert metrics.ece(2.0, 1.0, y) > 0.1  # overconfident by a factor 3 in std


def test_interval_coverage_and_width_by_hand():
    cov, width = metrics.interval(0.0, 1.0, np.array([0.0, 1.0, 2.0, 3.0]), 0.95)
    assert cov == pytest.approx(0.5)
    assert width == pytest.approx(2 * 1.959963984540054)
    with pytest.raises(ValueError, match="level"):
        metrics.interval(0.0, 1.0, 0.0, 1.0)


def test_auroc_by_hand_with_ties():
    assert metrics.auroc([0.1, 0.4], [0.35, 0.8]) == pytest.approx(0.75)
    assert metrics.auroc([1.0], [1.0]) == pytest.approx(0.5)
    assert metrics.auroc([0.0, 0.1], [0.5, 0.6]) == pytest.approx(1.0)
    assert metrics.auroc([0.5, 0.6], [0.0, 0.1]) == pytest.approx(0.0)


def test_decomposition_by_hand():
    d = metrics.decomposition(np.array([1.0, 3.0]), np.array([1.0, 0.0]))
    assert d["aleatoric_var"] == pytest.approx(2.0)
    assert d["epistemic_var"] == pytest.approx(0.5)
    assert d["epistemic_fraction"] == pytest.approx(0.5 / 2.5)
    assert d["mean_std"] == pytest.approx((math.sqrt(2.0) + math.sqrt(3.0)) / 2)


def test_regression_report_uses_total_variance_and_accepts_tensors():
    ale, epi = STD**2 * 0.6, STD**2 * 0.4
    pred = Prediction(torch.tensor(MEAN), torch.tensor(ale), torch.tensor(epi))
    report = metrics.regression_report(pred, torch.tensor(Y), samples=torch.tensor(SAMPLES))
    assert report["nll"] == pytest.approx(-np.mean(stats.norm.logpdf(Y, MEAN, STD)), rel=1e-9)
    assert report["crps"] == pytest.approx(np.mean(sr.crps_normal(Y, MEAN, STD)), rel=1e-9)
    assert report["crps_samples"] == pytest.approx(np.mean(sr.crps_ensemble(Y, SAMPLES, m_axis=0)), rel=1e-9)
    assert report["epistemic_fraction"] == pytest.approx(0.4)
    assert report["n"] == Y.size
    for level in (50, 90, 95):
        assert 0.0 <= report[f"coverage_{level}"] <= 1.0
    assert report["width_50"] < report["width_90"] < report["width_95"]


def test_regression_report_rejects_bad_input():
    with pytest.raises(ValueError, match="shape"):
        metrics.regression_report(Prediction(np.zeros(3), np.ones(3), np.zeros(3)), np.zeros(4))
    with pytest.raises(ValueError, match="non-negative"):
        metrics.regression_report(Prediction(np.zeros(3), -np.ones(3), np.zeros(3)), np.zeros(3))


def test_wilson_interval_by_hand_and_against_scipy():
    # 8 of 10, z = 1.96: c = 9.9208 / 13.8416 = 0.71674, h = 1.96 / 13.8416 * sqrt(1.6 + 0.9604) = 0.22658
    assert metrics.wilson(8, 10) == pytest.approx((0.71674 - 0.22658, 0.71674 + 0.22658), abs=1e-5)
    assert metrics.wilson(0, 10) == pytest.approx((0.0, 3.8416 / 13.8416))  # k = 0: c = h = z^2 / 2 / (n + z^2)
    assert metrics.wilson(10, 10) == pytest.approx((10 / 13.8416, 1.0))
    z = stats.norm.ppf(0.975)
    for k, n in ((3, 17), (40, 41), (1, 1000)):
        ci = stats.binomtest(k, n).proportion_ci(method="wilson")
        assert metrics.wilson(k, n, z) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert all(math.isnan(v) for v in metrics.wilson(0, 0))
    with pytest.raises(ValueError, match="0 <= k <= n"):
        metrics.wilson(11, 10)


def test_holm_adjusted_p_values_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04; running max 0.02, 0.03, 0.06, 0.06
    np.testing.assert_allclose(metrics.holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(metrics.holm([0.5, 0.4]), [0.8, 0.8])  # 2 * 0.4, then max(0.8, 0.5)
    np.testing.assert_allclose(metrics.holm([0.3, 0.6, 0.02]), [0.6, 0.6, 0.06])
    assert metrics.holm([0.7])[0] == 0.7 and metrics.holm([0.9, 0.8]).tolist() == [1.0, 1.0]  # capped at 1
    with pytest.raises(ValueError, match="p-values"):
        metrics.holm([0.5, 1.5])
