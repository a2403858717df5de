"""IVON: trained through the controller's hooks, its posterior variance shrinks with more data, the checkpointed
Hessian is the optimizer's, and prediction samples have the posterior's spread."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils import parameters_to_vector

from agents.encoders import EncoderConfig
from agents.ivon_vi import IVONConfig

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = IVONConfig(encoder=EncoderConfig(kind="ft_features", in_dim=2, d_model=8), out_dim=1, n_blocks=1, n_heads=2)


def _data(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    return x, torch.sin(2 * x[:, :1]) + 0.5 * x[:, 1:] + 0.1 * torch.randn(n, 1, generator=g)


def _train(n_train, steps=300, batch=32):
    torch.manual_seed(0)
    model = CFG.build()
    x, y = _data(n_train)
    model.set_target_stats(y.mean(0), y.std(0))
    opt = model.configure_optimizer(lr=1e-3, weight_decay=0.0, n_train=n_train)  # the trainer's lr is not IVON's
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        idx = torch.randint(n_train, (batch,), generator=g)
        losses.append(model.training_step(x[idx], y[idx], opt, grad_clip=1.0).item())
    return model, opt, losses


def test_posterior_variance_shrinks_with_more_data():
    small, _, losses_small = _train(32)
    large, _, losses_large = _train(2048)
    assert sum(losses_large[-20:]) < 0.75 * sum(losses_large[:20])  # the sampled steps learn
    var_small, var_large = small.posterior_var().mean(), large.posterior_var().mean()
    assert var_large < var_small / 20  # sigma^2 = 1 / (lambda (h + delta)), lambda = n_train: 1/64 in lambda
    x_test = _data(64, seed=9)[0]
    spread = [m.predict(x_test, 64, torch.Generator().manual_seed(2)).epistemic_var.mean() for m in (small, large)]
    assert spread[1] < spread[0] / 5


def test_buffers_hold_the_optimizers_posterior_and_samples_have_its_spread():
    model, opt, _ = _train(256, steps=30)
    torch.testing.assert_close(model.posterior_hess, opt.param_groups[0]["hess"])
    assert model.ess.item() == 256
    expected = 1 / (256 * (opt.param_groups[0]["hess"] + CFG.prior_precision))
    torch.testing.assert_close(model.posterior_var(), expected)
    # the sampled weights theta = m + sigma eps: recover sigma^2 from the draws the prediction uses
    mean = parameters_to_vector(model.net.parameters())
    g = torch.Generator().manual_seed(0)
    std = model.posterior_var().sqrt()
    draws = torch.stack([mean + std * torch.randn(mean.shape, generator=g) for _ in range(4000)])
    ratio = draws.var(0) / model.posterior_var()
    assert ratio.mean().item() == pytest.approx(1.0, abs=0.02)
    x = _data(8, seed=3)[0]
    a = model.moments(x, 5, torch.Generator().manual_seed(4))[0]
    b = model.moments(x, 5, torch.Generator().manual_seed(4))[0]
    assert torch.equal(a, b) and a.var(0).mean() > 0
    clone = CFG.build()
    clone.load_state_dict(model.state_dict())
    assert torch.equal(clone.moments(x, 5, torch.Generator().manual_seed(4))[0], a)
