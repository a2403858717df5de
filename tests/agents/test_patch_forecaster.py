"""PatchTST forecaster: shapes, what the forecast may depend on, RevIN's equivariance, a tiny overfit on a sine,
SA mean-preserving with dispersion falling as nu^-1/2, dropout only in training, determinism under a seed."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from agents.encoders import EncoderConfig
from agents.layers.stochastic_attention import stochastic_attention
from agents.patch_forecaster import PatchTSTConfig
from agents.registry import CONTROLLERS, config_from_dict, config_to_dict

pytestmark = pytest.mark.usefixtures("one_thread")

L, H, C = 64, 16, 3
SMALL = PatchTSTConfig(
    encoder=EncoderConfig(kind="patches", in_dim=1, n_tokens=L, d_model=16), out_dim=H, n_layers=2, n_heads=2,
    d_ff=32, dropout=0.0,
)  # fmt: skip


def build(cfg: PatchTSTConfig = SMALL, seed: int = 0):
    torch.manual_seed(seed)
    return cfg.build()


def sine_windows(n: int = 48, seed: int = 0, noise: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows (n, L, C) and targets (n, H): channel C-1 (the target) is a noisy sine of period 24, the others noise."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n * 4 + L + H, dtype=torch.float32)
    target = 3 + 2 * torch.sin(2 * math.pi * t / 24) + noise * torch.randn(t.shape, generator=g)
    data = torch.stack([torch.randn(t.shape, generator=g) for _ in range(C - 1)] + [target], -1)  # (T, C)
    starts = range(0, n * 4, 4)
    x = torch.stack([data[s : s + L] for s in starts])  # (n, L, C)
    y = torch.stack([data[s + L : s + L + H, -1] for s in starts])  # (n, H)
    return x, y


def test_registered_and_config_round_trips():
    assert CONTROLLERS["patchtst"] is PatchTSTConfig
    assert config_from_dict("patchtst", config_to_dict(SMALL)) == SMALL


@pytest.mark.parametrize(("in_dim", "horizon"), [(1, 96), (7, 192)])
def test_default_sizes_give_forecast_moments_of_the_horizon(in_dim, horizon):
    enc = EncoderConfig(kind="patches", in_dim=in_dim, n_tokens=336, d_model=32)
    model = build(PatchTSTConfig(encoder=enc, out_dim=horizon)).eval()
    assert model.encoder.n_patches == 42  # PatchTST's N for L = 336, P = 16, stride 8
    x = torch.randn(5, 336, 7)
    mu, var = model.moments(x, 3)
    assert mu.shape == var.shape == (3, 5, horizon) and (var > 0).all()
    assert torch.equal(mu[0], mu[2])  # SA off: deterministic, one pass for every sample
    pred = model.predict(x)
    assert pred.mean.shape == (5, horizon) and torch.equal(pred.epistemic_var, torch.zeros(5, horizon))


def test_forecast_depends_on_the_whole_target_window_and_nothing_else():
    model = build().eval()
    x, _ = sine_windows(6)
    x.requires_grad_(True)
    mu, _ = model.moments(x, 1)
    mu[0, 2].sum().backward()
    grad = x.grad.abs()  # (B, L, C)
    assert (grad[2, :, -1] > 0).all()  # every look-back step of the target reaches the forecast
    assert grad[2, :, :-1].max() == 0  # channel independence: the other channels do not
    assert grad[[0, 1, 3, 4, 5]].max() == 0  # nor do the other windows of the batch
    with torch.no_grad():
        again = model.moments(x, 1)[0]
        other = x.clone()
        other[:, :, :-1] = torch.randn(6, L, C - 1)
        other[0] += 1.0
        moved = model.moments(other, 1)[0]
    assert torch.equal(again, mu.detach())  # no state carried between calls
    torch.testing.assert_close(moved[0, 1:], mu.detach()[0, 1:])


def test_channel_mixing_reads_the_covariates():
    enc = EncoderConfig(kind="patches", in_dim=C, n_tokens=L, d_model=16)
    model = build(PatchTSTConfig(encoder=enc, out_dim=H, n_layers=1, n_heads=2, d_ff=32, dropout=0.0)).eval()
    x, _ = sine_windows(4)
    other = x.clone()
    other[:, :, 0] += torch.randn(4, L)
    with torch.no_grad():
        assert (model.moments(x, 1)[0] - model.moments(other, 1)[0]).abs().max() > 1e-4


def test_revin_makes_the_forecast_equivariant_to_the_target_units():
    model = build().eval()
    model.set_target_stats(torch.full((H,), 2.0), torch.full((H,), 0.5))  # any target standardisation
    x, _ = sine_windows(5)
    a, b = 7.0, -3.0
    shifted = x.clone()
    shifted[..., -1] = a * x[..., -1] + b
    with torch.no_grad():
        mu, var = model.moments(x, 1)
        mu2, var2 = model.moments(shifted, 1)
    torch.testing.assert_close(mu2, a * mu + b, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(var2, a**2 * var, rtol=1e-3, atol=1e-6)


def test_tiny_overfit_on_a_sine_lowers_the_loss_and_beats_the_last_value():
    model = build(dataclasses.replace(SMALL, dropout=0.1))
    x, y = sine_windows(48)
    model.set_target_stats(y.mean(0), y.std(0))
    opt = model.configure_optimizer(lr=3e-3, weight_decay=0.0, n_train=len(x))
    losses = [model.training_step(x, y, opt, grad_clip=1.0).item() for _ in range(120)]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.3
    model.eval()
    with torch.no_grad():
        mse = ((model.predict(x).mean - y) ** 2).mean()
    naive = ((x[:, -1:, -1] - y) ** 2).mean()  # repeat the last observed value
    assert mse < 0.1 * naive, f"mse {mse:.4f} vs last-value {naive:.4f}"


def test_sa_is_mean_preserving_with_dispersion_falling_as_one_over_sqrt_nu():
    model = build(seed=1).eval()
    x, _ = sine_windows(4)
    m = 1000
    with torch.no_grad():
        det = model.moments(x, 1)[0][0]  # (B, H)
        spreads = []
        nus = [2, 8, 32, 128, 512]
        for nu in nus:
            with stochastic_attention(model, nu, torch.Generator().manual_seed(nu)):
                mu = model.moments(x, m)[0]  # (M, B, H): M independent passes
            spreads.append((mu - det).pow(2).mean().sqrt().item())
            bias = (mu.mean(0) - det).abs()  # (B, H)
            if nu == 32:  # the network's nonlinearity adds an O(1/nu) bias, small against the O(nu^-1/2) spread
                assert bias.mean() < 0.15 * spreads[-1]
            if nu == 512:  # mean-preserving: the average of M passes is f up to Monte-Carlo error (E|Z| = 0.8)
                assert (bias / (mu.std(0) / m**0.5)).mean() < 1.5
        assert torch.equal(model.moments(x, 1)[0][0], det)  # SA off again after the block
    assert all(a > b for a, b in zip(spreads, spreads[1:], strict=False))
    slope = np.polyfit(np.log(nus), np.log(spreads), 1)[0]
    assert slope == pytest.approx(-0.5, abs=0.1)


def test_dropout_acts_in_training_only():
    model = build(dataclasses.replace(SMALL, dropout=0.3, attn_dropout=0.3))
    x, _ = sine_windows(4)
    with torch.no_grad():
        model.train()
        assert not torch.equal(model.moments(x, 1)[0], model.moments(x, 1)[0])
        model.eval()
        assert torch.equal(model.moments(x, 1)[0], model.moments(x, 1)[0])


def test_deterministic_under_a_seed():
    x, y = sine_windows(8)
    cfg = dataclasses.replace(SMALL, dropout=0.2)
    a, b = build(cfg, seed=5), build(cfg, seed=5)
    for model in (a, b):
        torch.manual_seed(0)
        model.training_step(x, y, model.configure_optimizer(1e-3, 0.0, 8), grad_clip=1.0)  # dropout draws too
    a.eval(), b.eval()
    with torch.no_grad():
        assert torch.equal(a.moments(x, 1)[0], b.moments(x, 1)[0])
        draws = []
        for model in (a, b, a):
            seed = 0 if len(draws) < 2 else 1
            with stochastic_attention(model, 8, torch.Generator().manual_seed(seed)):
                draws.append(model.moments(x, 4)[0])
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
