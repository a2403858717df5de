"""Contextual dropout: the dropout rates depend on the input (prior) and on the label (posterior); the KL term is the
closed form of two Gaussians; the objective is the negative ELBO and training moves the rates with the input."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from agents.contextual_dropout import ContextNoise, ContextualDropoutConfig, gaussian_dropout_kl
from agents.encoders import EncoderConfig

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = ContextualDropoutConfig(encoder=EncoderConfig(kind="ft_features", in_dim=2, d_model=16), out_dim=1, n_heads=2)


def test_kl_is_the_gaussian_closed_form():
    g = torch.Generator().manual_seed(0)
    log_q, log_p = torch.randn(100, generator=g), torch.randn(100, generator=g)
    expected = kl_divergence(Normal(1.0, (0.5 * log_q).exp()), Normal(1.0, (0.5 * log_p).exp()))
    torch.testing.assert_close(gaussian_dropout_kl(log_q, log_p), expected)


def test_rates_depend_on_the_input_and_the_posterior_on_the_label():
    torch.manual_seed(0)
    model = CFG.build()
    x = torch.randn(16, 2) * 2
    rates = model.dropout_rates(x)
    assert len(rates) == 3 and rates[0].shape == (16, 3, model.net.blocks[0].hidden)  # 2 features + CLS
    assert rates[-1].shape[1] == 1  # the last block computes the CLS row only
    assert all(((r > 0) & (r < 1)).all() for r in rates)
    assert rates[0].mean().item() == pytest.approx(0.1, abs=0.05)  # starts near the backbone's FFN rate
    spread = torch.stack([r.std(0).mean() for r in rates])  # per unit and token, across the 16 inputs
    assert (spread > 5e-4).all()  # different inputs, different rates, in every block
    with torch.no_grad():  # the posterior q(z | x, y) reads y (its label embedding starts at 0: q = p, KL = 0)
        noise = ContextNoise(y=torch.zeros(16, 1))
        model.net(x, noise)
        assert torch.stack(noise.kl).abs().max() < 1e-6
        for block in model.net.blocks:
            block.ctx_y.weight.normal_()
        a, b = ContextNoise(y=torch.zeros(16, 1)), ContextNoise(y=torch.ones(16, 1))
        model.net(x, a), model.net(x, b)
        assert not torch.allclose(a.rates[0], b.rates[0]) and (torch.stack(b.kl) > 0).all()


def test_loss_is_the_negative_elbo_and_prediction_samples_from_the_prior():
    torch.manual_seed(0)
    model = CFG.build()
    x, y = torch.randn(8, 2), torch.randn(8, 1)
    with torch.no_grad():
        for block in model.net.blocks:
            block.ctx_y.weight.normal_()
    torch.manual_seed(1)
    loss = model.loss(x, y)  # targets standardised inside (loc 0, scale 1 here)
    torch.manual_seed(1)
    noise = ContextNoise(dropout=True, y=y)
    pred = model.net(x, noise)
    nelbo = ((pred - y) ** 2).sum(-1) + torch.stack(noise.kl).sum(0)
    torch.testing.assert_close(loss, nelbo.mean())
    mu, var = model.moments(x, 16, torch.Generator().manual_seed(0))
    assert mu.var(0).mean() > 0 and torch.equal(var, torch.zeros_like(var))
    assert torch.equal(mu, model.moments(x, 16, torch.Generator().manual_seed(0))[0])


def test_rates_stay_input_dependent_through_training():
    """What the ELBO with a learnable prior does to the rates on a toy (measured; see the module docstring)."""
    torch.manual_seed(0)
    model = CFG.build()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(256, 2, generator=g) * 4 - 2
    y = x[:, :1] + torch.randn(256, 1, generator=g) * (0.05 + 0.5 * (x[:, :1] > 0))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for _ in range(100):
        loss = model.loss(x, y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first / 4
    with torch.no_grad():
        rates = model.dropout_rates(x)
    assert max(r.std(0).mean().item() for r in rates) > 1e-3  # still a function of the input
    assert all(r.mean().item() < 0.1 for r in rates)  # nothing in this ELBO holds the rates up: they drift down
