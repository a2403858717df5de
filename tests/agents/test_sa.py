"""SA: multinomial resampling is mean-preserving with variance ~ 1/nu, reaches stock and our attention, switches off
exactly; the Bayesian optimisation of nu finds the grid-search optimum of L_SA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from agents.layers.attention import SelfAttention
from agents.layers.nsac_attention import NSACAttention
from agents.layers.stochastic_attention import (
    disable_stochastic_attention,
    enable_stochastic_attention,
    is_stochastic,
    multinomial_average,
    stochastic_attention,
    stochastic_sdpa,
)
from agents.sa import LogLogPosterior, calibrate_nu, grid_search_nu, sa_evaluate

pytestmark = pytest.mark.usefixtures("one_thread")


def _slope(nus, variances):
    return np.polyfit(np.log(nus), np.log(variances), 1)[0]


@pytest.mark.parametrize("nu", [3, 40, 500])  # 3, 40 <= 2n: torch.multinomial; 500: the binomial chain
def test_multinomial_average_is_mean_preserving_with_the_multinomial_covariance(nu):
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(6, 20, generator=g) * 2, -1)
    draws = multinomial_average(probs.expand(20000, 6, 20), nu, g)  # (R, 6, 20)
    assert torch.allclose(draws.sum(-1), torch.ones(20000, 6))
    assert ((draws * nu) - (draws * nu).round()).abs().max() < 1e-3  # counts / nu
    se = (probs * (1 - probs) / nu / 20000).sqrt()
    assert ((draws.mean(0) - probs).abs() <= 5 * se + 1e-7).all()
    cov = torch.einsum("ri,rj->ij", draws[:, 0] - probs[0], draws[:, 0] - probs[0]) / 20000
    expected = (torch.diag(probs[0]) - torch.outer(probs[0], probs[0])) / nu
    assert (cov - expected).abs().max() < 0.05 * expected.diagonal().max()


def test_multinomial_average_variance_scales_as_one_over_nu():
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(50, 16, generator=g), -1)
    nus = [4, 16, 64, 256, 1024]
    variances = [multinomial_average(probs.expand(4000, 50, 16), nu, g).var(0).mean().item() for nu in nus]
    assert _slope(nus, variances) == pytest.approx(-1, abs=0.05)


def test_rows_without_mass_pass_through():
    probs = torch.tensor([[0.25, 0.75], [0.0, 0.0], [float("nan"), float("nan")]])
    out = multinomial_average(probs, 10, torch.Generator().manual_seed(0))
    assert torch.equal(out[1], probs[1]) and out[2].isnan().all()
    with pytest.raises(ValueError, match="nu"):
        multinomial_average(probs, 0)


@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_mask", "gqa"])
def test_stochastic_sdpa_with_huge_nu_is_sdpa(case):
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8, generator=g), torch.randn(2, 4, 7, 8, generator=g), torch.randn(2, 4, 7, 3)
    kw = {}
    if case == "causal":
        k, v = k[:, :, :5], v[:, :, :5]
        kw = {"is_causal": True}
    elif case == "bool_mask":
        kw = {"attn_mask": torch.rand(5, 7, generator=g) > 0.3}
        kw["attn_mask"][:, 0] = True
    elif case == "float_mask":
        kw = {"attn_mask": torch.randn(5, 7, generator=g)}
    elif case == "gqa":
        k, v = k[:, :2], v[:, :2]
        kw = {"enable_gqa": True}
    ref = F.scaled_dot_product_attention(q, k, v, **kw)
    out = stochastic_sdpa(q, k, v, **kw, nu=10**8, generator=g)
    torch.testing.assert_close(out, ref, atol=3e-3, rtol=0)


def _train(model, x, y, steps=30):
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return model.eval()


class _MHAModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
        self.out = nn.Linear(16, 2)

    def forward(self, x):
        return self.out(self.attn(x, x, x)[0].mean(1))


def test_stock_multihead_attention_of_a_trained_model():
    torch.manual_seed(0)
    x, y = torch.randn(64, 6, 16), torch.randn(64, 2)
    model = _train(_MHAModel(), x, y)
    mha, xs = model.attn, x[:4]
    with torch.no_grad():
        det, det_w = mha(xs, xs, xs)
        reps = xs.repeat(3000, 1, 1)  # many draws in one batch
        variances = []
        nus = [2, 8, 32, 128]
        for nu in nus:
            enable_stochastic_attention(model, nu, torch.Generator().manual_seed(nu))
            draws = mha(reps, reps, reps)[0].view(3000, *det.shape)
            variances.append(draws.var(0).mean().item())
            if nu == 8:  # mean-preserving: the average of many draws is the deterministic output
                assert (draws.mean(0) - det).abs().max() < 5 * (draws.var(0).max() / 3000).sqrt()
                _, w = mha(xs, xs, xs)
                assert not torch.allclose(w, det_w) and torch.allclose(w.sum(-1), torch.ones(4, 6))
        assert _slope(nus, variances) == pytest.approx(-1, abs=0.05)
        disable_stochastic_attention(model)
        assert not is_stochastic(model)
        assert torch.equal(mha(xs, xs, xs)[0], det) and torch.equal(mha(xs, xs, xs)[1], det_w)


def test_stock_transformer_encoder_of_a_trained_model_in_eval_fast_path_conditions():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True)
    encoder = nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Flatten(), nn.Linear(96, 2))
    x, y = torch.randn(64, 6, 16), torch.randn(64, 2)
    model = _train(encoder, x, y)
    with torch.no_grad():  # eval + no_grad: PyTorch would take its fused fast path, which SA must switch off
        det = model(x)
        enable_stochastic_attention(model, 4, torch.Generator().manual_seed(0))
        a, b = model(x), model(x)
        assert (a - det).abs().max() > 1e-3 and (a - b).abs().max() > 1e-3
        enable_stochastic_attention(model, 10**7)  # calling again changes nu
        assert (model(x) - det).abs().max() < 0.05 * det.abs().max()
        disable_stochastic_attention(model)
        assert torch.equal(model(x), det)


def test_our_sdpa_self_attention_and_nsac_attention():
    torch.manual_seed(0)
    sa = SelfAttention(16, 4).eval()
    x = torch.randn(3, 5, 16)
    det = sa(x)
    with stochastic_attention(sa, 2, torch.Generator().manual_seed(0)):
        assert (sa(x) - det).abs().max() > 1e-3
    assert torch.equal(sa(x), det)

    nsac = NSACAttention(16, 4, top_k=3)
    g = torch.Generator().manual_seed(0)
    base = nsac(x, 2, torch.Generator().manual_seed(1))
    alpha = nsac.internals()["attention"]
    enable_stochastic_attention(nsac, 5, g)
    nsac(x, 2, torch.Generator().manual_seed(1))
    resampled = nsac.internals()["attention"]
    assert not torch.allclose(resampled, alpha) and ((resampled * 5) - (resampled * 5).round()).abs().max() < 1e-4
    disable_stochastic_attention(nsac)
    assert nsac.sa_resample is None and torch.equal(nsac(x, 2, torch.Generator().manual_seed(1)), base)


def test_context_manager_restores_previous_setting_even_on_error():
    sa = SelfAttention(8, 2).eval()
    enable_stochastic_attention(sa, 7)
    with pytest.raises(RuntimeError, match="boom"), stochastic_attention(sa, 100):
        assert sa._sa_state.nu == 100
        raise RuntimeError("boom")
    assert sa._sa_state.nu == 7
    disable_stochastic_attention(sa)
    with stochastic_attention(sa, 3):
        pass
    assert not is_stochastic(sa)


def test_loglog_posterior_recovers_a_power_law():
    rng = np.random.default_rng(0)
    log_nu = np.log(np.array([2, 8, 30, 100, 400, 2000, 9000], dtype=float))
    log_d = np.log(3.0) - 0.5 * log_nu + rng.normal(0, 0.02, log_nu.size)
    post = LogLogPosterior(slope_mean=0.0).fit(log_nu, log_d)
    assert post.mean[1] == pytest.approx(-0.5, abs=0.02) and post.mean[0] == pytest.approx(np.log(3), abs=0.08)
    draws = np.array([post.sample(rng) for _ in range(2000)])
    assert draws[:, 1].std() < 0.05 and abs(draws[:, 1].mean() + 0.5) < 0.02


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.out = SelfAttention(16, 2), SelfAttention(16, 2), nn.Linear(16, 3)

    def forward(self, x):
        return self.out(self.b(self.a(x)).mean(1))


def test_bayesian_optimisation_finds_the_grid_search_optimum():
    torch.manual_seed(0)
    model = _Tiny().eval()
    x = torch.randn(128, 8, 16) * 2
    with torch.no_grad(), stochastic_attention(model, 40, torch.Generator().manual_seed(123)):
        y = model(x)  # targets whose error around f matches SA at some nu
    grid = grid_search_nu(model, x, y, [2**i for i in range(1, 17)], n_passes=8)
    best = min(grid, key=lambda e: e.loss)
    assert 2 < best.nu < 2**16  # an interior optimum, so the check means something
    result = calibrate_nu(model, x, y, n_passes=8)
    assert not is_stochastic(model)
    assert result.converged and result.n_evals <= 12 and result.wall_time_s > 0
    assert abs(np.log2(result.nu) - np.log2(best.nu)) <= 1  # within one grid step
    assert sa_evaluate(model, x, y, result.nu, 8).loss <= 1.1 * best.loss
    assert result.slope == pytest.approx(-0.5, abs=0.1)  # dispersion ~ nu^-1/2
    assert [c["nu"] for c in result.curve] == sorted(c["nu"] for c in result.curve)


def test_sa_on_a_registered_baseline_controller_and_calibration_through_its_moments():
    from agents.encoders import EncoderConfig
    from agents.gmle import GMLEConfig

    torch.manual_seed(0)
    model = GMLEConfig(encoder=EncoderConfig(kind="features", in_dim=4, d_model=16), out_dim=1).build().eval()
    x = torch.randn(64, 4)
    point = lambda m, x: m.moments(x, 1)[0][0]  # noqa: E731  the controller's point prediction f(x)
    with torch.no_grad():
        det = point(model, x)
        with stochastic_attention(model, 2, torch.Generator().manual_seed(0)):
            assert (point(model, x) - det).abs().max() > 1e-4  # its SelfAttention (SDPA) became stochastic
        assert torch.equal(point(model, x), det)
    y = det + 0.05 * torch.randn_like(det)
    result = calibrate_nu(model, x, y, forward=point, n_passes=4, max_evals=6)
    assert 2 <= result.nu <= 1 << 16 and len(result.curve) == result.n_evals and not is_stochastic(model)


def test_calibration_refuses_a_model_without_reachable_attention():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 2)).eval()
    x = torch.randn(8, 3, 4)
    with pytest.raises(RuntimeError, match="no attention"):
        calibrate_nu(model, x, torch.randn(8, 2), n_passes=2)
