"""drive/calibration.py: temperature scaling and split conformal reach their target coverage on held-out toy data
with a known miscalibration; the conformal quantile is finite-sample exact; widths at matched coverage are scale-free.
(Here beside the methods it calibrates; move to the drive tests once that package's layout settles.)"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import optimize

from drive.calibration import (
    conformal_quantile,
    coverage_of,
    fit_conformal_scale,
    fit_temperature,
    gaussian_interval,
    gaussian_quantile,
    rescale_samples,
    width_at_coverage,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _toy(n, seed, true_factor=2.0, tails=None):
    """Predicted N(mean, std^2) with std varying per case; outcomes spread true_factor x wider than predicted."""
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(n, 2, generator=g, dtype=torch.float64)
    std = 0.2 + torch.rand(n, 2, generator=g, dtype=torch.float64)
    noise = torch.randn(n, 2, generator=g, dtype=torch.float64)
    if tails is not None:  # Student-t with `tails` dof, unit variance
        chi2 = torch.randn(tails, n, 2, generator=g, dtype=torch.float64).square().sum(0)
        noise = noise / (chi2 / tails).sqrt() * math.sqrt((tails - 2) / tails)
    return mean, std, mean + true_factor * std * noise


def test_temperature_is_the_nll_minimiser_and_recovers_the_miscalibration():
    mean, std, y = _toy(2000, 0)
    t = fit_temperature(mean, std, y)

    def nll(temp):
        s = temp * std
        return (torch.log(s) + (y - mean) ** 2 / (2 * s**2)).mean().item()

    numerical = optimize.minimize_scalar(nll, bounds=(0.1, 10), method="bounded", options={"xatol": 1e-8}).x
    assert t.item() == pytest.approx(numerical, rel=1e-5)
    assert t.item() == pytest.approx(2.0, rel=0.04)
    test = _toy(20000, 1)
    before = coverage_of(*gaussian_interval(test[0], test[1], 0.95), test[2])
    after = coverage_of(*gaussian_interval(test[0], test[1], 0.95, t), test[2])
    assert before.item() == pytest.approx(0.68, abs=0.02)  # |Z| <= 1.96 / 2
    assert after.item() == pytest.approx(0.95, abs=0.01)


def test_conformal_reaches_the_target_even_where_the_gaussian_shape_is_wrong():
    cal, test = _toy(4000, 2, tails=3), _toy(40000, 3, tails=3)  # Student-t(3): a Gaussian rescaling misses
    t = fit_temperature(*cal)
    s = fit_conformal_scale(*cal, 0.9)
    by_temperature = coverage_of(*gaussian_interval(test[0], test[1], 0.9, t), test[2]).item()
    by_conformal = coverage_of(*gaussian_interval(test[0], test[1], 0.9, s), test[2]).item()
    assert by_conformal == pytest.approx(0.9, abs=0.008)
    assert by_temperature > 0.915  # ~0.93: the fitted variance is right, the tails are not Gaussian


def test_conformal_quantile_is_finite_sample_exact():
    # n = 19 calibration cases, c = 0.9: k = ceil(20 * 0.9) = 18, and E[test coverage] = k / (n + 1) = 0.9 exactly
    covered = []
    for rep in range(400):
        cal, test = _toy(19, 100 + rep), _toy(200, 10000 + rep)
        q = conformal_quantile(cal[0][:, :1], cal[1][:, :1], cal[2][:, :1], 0.9)
        scores = ((cal[2][:, :1] - cal[0][:, :1]) / cal[1][:, :1]).abs().flatten()
        assert q == scores.sort().values[17]
        covered.append(((test[2] - test[0]).abs() <= q * test[1]).double().mean())
    assert torch.stack(covered).mean().item() == pytest.approx(0.9, abs=0.01)
    assert math.isinf(conformal_quantile(*_toy(10, 0), 0.96).item())  # ceil(21 * 0.96) = 21 > 20 cases
    assert fit_conformal_scale(*_toy(500, 5), 0.9) == conformal_quantile(*_toy(500, 5), 0.9) / gaussian_quantile(0.9)


def test_width_at_matched_coverage_is_scale_free_and_ranks_sharpness():
    cal, test = _toy(3000, 6), _toy(20000, 7)
    sharp = width_at_coverage(cal, test, 0.9)
    mis_scaled = width_at_coverage((cal[0], 5 * cal[1], cal[2]), (test[0], 5 * test[1], test[2]), 0.9)
    torch.testing.assert_close(mis_scaled.width, sharp.width)  # a global scale error is undone by the rescaling
    assert sharp.coverage.item() == pytest.approx(0.9, abs=0.01)
    # a predictor whose std ignores the per-case spread is wider at the same coverage
    flat = width_at_coverage((cal[0], torch.ones_like(cal[1]), cal[2]), (test[0], torch.ones_like(test[1]), test[2]))
    assert flat.coverage.item() == pytest.approx(0.95, abs=0.01)
    assert flat.width > width_at_coverage(cal, test, 0.95).width


def test_rescale_samples_scales_the_spread_around_the_sample_mean():
    samples = torch.randn(500, 4, 2, generator=torch.Generator().manual_seed(0)) + 3
    out = rescale_samples(samples, 2.5)
    torch.testing.assert_close(out.mean(0), samples.mean(0))
    torch.testing.assert_close(out.std(0), 2.5 * samples.std(0))
    with pytest.raises(ValueError, match="positive"):
        fit_temperature(torch.zeros(3), torch.zeros(3), torch.ones(3))


def test_aleatoric_temperature_reaches_its_coverage_on_held_out_cases_and_leaves_the_epistemic_part():
    """Outcomes drawn from N(m, 4 a + v): only the aleatoric part is 2x too narrow; the fitted T (per column) is
    ~2, and the tempered interval covers ~90 % of fresh cases, where T = 1 covers far fewer."""
    from drive.calibration import fit_aleatoric_temperature

    def draw(n, seed):
        g = torch.Generator().manual_seed(seed)
        m = torch.randn(n, 2, generator=g, dtype=torch.float64)
        a = torch.rand(n, 2, generator=g, dtype=torch.float64) * 0.5 + 0.05
        v = torch.rand(n, 2, generator=g, dtype=torch.float64) * 0.05
        y = m + torch.randn(n, 2, generator=g, dtype=torch.float64) * (4 * a + v).sqrt()
        return m, a, v, y

    t = fit_aleatoric_temperature(*draw(4000, 0), coverage=0.9)
    assert t.shape == (2,) and torch.allclose(t, torch.full((2,), 2.0, dtype=t.dtype), atol=0.12)
    m, a, v, y = draw(4000, 1)
    z = gaussian_quantile(0.9)
    covered = lambda tt: ((y - m).abs() <= z * (tt**2 * a + v).sqrt()).double().mean(0)  # noqa: E731
    assert torch.all((covered(t) - 0.9).abs() < 0.02)
    assert torch.all(covered(torch.ones(2, dtype=t.dtype)) < 0.7)
    # the finite-sample rule: ceil((n + 1) c) > n -> no finite T
    assert math.isinf(fit_aleatoric_temperature(*(x[:5] for x in draw(5, 2)), coverage=0.9)[0].item())
    # a case the epistemic spread alone already covers needs no aleatoric widening at all
    t0 = fit_aleatoric_temperature(torch.zeros(3, 1), torch.ones(3, 1), torch.ones(3, 1), torch.zeros(3, 1), 0.5)
    assert t0.item() == 0.0
