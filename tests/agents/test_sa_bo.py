"""SA's choice of nu: Yadav & Zhang's published routine recovers a known optimum on their kind of problem; on a toy
attention model our default routine finds the same nu as the published one (within a factor 2, both within 10 % of
the grid-search optimum of L_SA); a choice on the edge of the bracket widens the bracket and says so; a model whose
attention is unreachable is refused while a small-scale model with attention is not."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from agents.layers.attention import SelfAttention
from agents.layers.stochastic_attention import is_stochastic, stochastic_attention
from agents.sa import calibrate_nu, grid_search_nu, sa_evaluate
from agents.sa_published import objective, optimum, search

pytestmark = pytest.mark.usefixtures("one_thread")


def test_published_routine_finds_the_optimum_of_a_lognormal_scale_problem():
    # ln d = ln 3 - 0.5 ln beta + N(0, 0.3^2), d0 = 0.2: beta* = (d0 / (b e^{1.5 s^2}))^{1/a} ~ 295
    a, log_b, s2, d0 = -0.5, math.log(3.0), 0.09, 0.2
    truth = float(optimum(a, log_b, s2, d0))
    rng = np.random.default_rng(0)
    found = search(lambda beta, k: np.exp(log_b + a * math.log(beta) + rng.normal(0, 0.3, 1)), d0, (1, 1 << 16),
                   np.random.default_rng(1))  # fmt: skip
    assert found.converged and found.n_evals == 40 + 10 * found.n_iter
    assert found.beta == pytest.approx(truth, rel=0.1)
    assert objective(found.beta, a, log_b, s2, d0) < 1.01 * objective(truth, a, log_b, s2, d0)
    assert found.slope == pytest.approx(a, abs=0.03) and found.noise_var == pytest.approx(s2, rel=0.2)


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.out = SelfAttention(16, 2), SelfAttention(16, 2), nn.Linear(16, 3)

    def forward(self, x):
        return self.out(self.b(self.a(x)).mean(1))


def _problem(true_nu: int, scale: float = 1.0):
    torch.manual_seed(0)
    model = _Tiny().eval()
    x = torch.randn(128, 8, 16) * 2
    with torch.no_grad(), stochastic_attention(model, true_nu, torch.Generator().manual_seed(123)):
        y = model(x)  # residuals around f shaped like SA at true_nu
    with torch.no_grad():
        f = model(x)
    return model, x, f + scale * (y - f)


@pytest.mark.parametrize("true_nu", [8, 300])
def test_default_and_published_routines_choose_the_same_nu(true_nu):
    model, x, y = _problem(true_nu)
    grid = grid_search_nu(model, x, y, [2**i for i in range(17)], n_passes=8)
    best = min(e.loss for e in grid)
    default = calibrate_nu(model, x, y, n_passes=8)
    published = calibrate_nu(model, x, y, n_passes=8, routine="published")
    assert not is_stochastic(model)
    assert published.routine == "published" and published.n_evals >= 40 and default.n_evals <= 12
    assert abs(math.log2(default.nu) - math.log2(published.nu)) <= 1
    for result in (default, published):
        assert result.converged and result.at_bound is None
        assert sa_evaluate(model, x, y, result.nu, 8).loss <= 1.1 * best
        assert result.slope == pytest.approx(-0.5, abs=0.05)


def test_a_choice_on_the_edge_widens_the_bracket_and_says_where_it_stays():
    model, x, y = _problem(8, scale=30.0)  # errors far beyond what SA disperses: the optimum is nu -> 0
    result = calibrate_nu(model, x, y, n_passes=4, nu_bounds=(2, 1 << 16))
    assert (result.nu, result.at_bound, result.nu_bounds, result.n_extensions) == (1, "low", (1, 1 << 16), 1)
    model, x, y = _problem(4000, scale=1.0)  # an optimum near nu ~ 1e4, above a bracket that stops at 256
    result = calibrate_nu(model, x, y, n_passes=4, nu_bounds=(1, 256))
    assert result.nu_bounds == (1, 256 * 256) and result.n_extensions == 1
    assert result.at_bound is None and 256 < result.nu < 256 * 256
    assert [c["nu"] for c in result.curve] == sorted(c["nu"] for c in result.curve) and result.n_evals == len(
        result.curve
    )


def test_unreachable_attention_is_refused_but_a_small_output_scale_is_not():
    with pytest.raises(RuntimeError, match="no attention"):  # rounding differences of a repeated batch only
        calibrate_nu(nn.Sequential(nn.Flatten(), nn.Linear(128, 3)).eval(), torch.randn(64, 8, 16),
                     torch.randn(64, 3), n_passes=4)  # fmt: skip
    model, x, y = _problem(40)
    tiny = lambda m, x: 1e-5 * m(x)  # noqa: E731  same model, outputs 1e-5 as large
    result = calibrate_nu(model, x, 1e-5 * y, forward=tiny, n_passes=4)
    assert result.at_bound is None and result.nu > 1


def test_published_routine_survives_a_log_noise_variance_beyond_float_range():
    # distances of 0 (SA changed nothing for some rows) are floored at 1e-300: ln d ~ -690 beside ln d ~ 0 makes
    # s_hat^2 ~ 1e5, and e^{2 s^2} overflows; MATLAB's exp gives Inf there (their code runs on), so must we
    assert np.isinf(objective(10, -0.5, 0.0, 1000.0, 0.2))
    rng = np.random.default_rng(0)

    def observe(beta, k):  # half the rows: no deviation at all
        d = np.exp(-0.5 * math.log(beta) + rng.normal(0, 0.3, 8))
        d[::2] = 0.0
        return d

    found = search(observe, 0.2, (1, 1 << 16), np.random.default_rng(1), max_iter=3)
    assert 1 <= found.beta <= 1 << 16 and found.n_evals >= 40
