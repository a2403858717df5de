"""SWAG: the diagonal + low-rank covariance equals a direct computation from the stored iterates, and its samples
have that covariance; MultiSWAG mixes independently initialised SWAG models; the posterior survives a checkpoint."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from agents.encoders import EncoderConfig
from agents.swag import MultiSWAGConfig, SWAGConfig

pytestmark = pytest.mark.usefixtures("one_thread")

ENC = EncoderConfig(kind="ft_features", in_dim=2, d_model=4)
SMALL = dict(encoder=ENC, out_dim=1, n_blocks=1, n_heads=2)  # a few hundred weights: dense covariance is cheap


def _collect_random_walk(model, n_iterates, seed=0):
    """Put the weights through a random walk, collecting after each 'epoch'; returns the stored iterates."""
    g = torch.Generator().manual_seed(seed)
    post = model.models[0]
    theta = parameters_to_vector(post.net.parameters()).detach().clone()
    iterates = []
    for epoch in range(1, n_iterates + 1):
        theta = theta + 0.05 * torch.randn(theta.shape, generator=g) + 0.02  # a drift too: the mean moves
        vector_to_parameters(theta, post.net.parameters())
        model.on_epoch_end(epoch, epoch)  # swa_start=0: every epoch is past the start
        iterates.append(theta.clone())
    return torch.stack(iterates)  # (n, P)


@pytest.mark.parametrize("n_iterates", [3, 12])  # fewer than K, and more (the ring buffer keeps the last K)
def test_covariance_matches_a_direct_computation_from_the_iterates(n_iterates):
    k = 5
    torch.manual_seed(0)
    model = SWAGConfig(**SMALL, max_rank=k, swa_start=0.0).build()
    thetas = _collect_random_walk(model, n_iterates)
    post = model.models[0]
    n = thetas.shape[0]
    mean = thetas.mean(0)
    diag = (thetas**2).mean(0) - mean**2
    running = thetas.cumsum(0) / torch.arange(1, n + 1).unsqueeze(1)  # theta_bar_i after collecting theta_i
    dev = (thetas - running)[-k:]  # the last K deviation columns (K, P)
    expected = 0.5 * (torch.diag(diag) + dev.T @ dev / (dev.shape[0] - 1))
    torch.testing.assert_close(post.mean, mean, rtol=0, atol=1e-5)
    torch.testing.assert_close(post.covariance(), expected, rtol=1e-3, atol=1e-6)


def test_samples_have_the_swag_covariance():
    torch.manual_seed(0)
    model = SWAGConfig(**SMALL, max_rank=4, swa_start=0.0).build()
    _collect_random_walk(model, 6)
    post = model.models[0]
    g = torch.Generator().manual_seed(1)
    draws = torch.stack([post.sample(g) for _ in range(20000)])  # (R, P)
    cov = post.covariance()
    directions = torch.randn(8, cov.shape[0], generator=g)
    directions[0] = post.columns()[0] / post.columns()[0].norm()  # along the low-rank part as well
    expected = torch.einsum("kp,pq,kq->k", directions, cov, directions)  # u^T Sigma u
    observed = (draws - post.mean) @ directions.T  # (R, 8)
    se = float((expected.max() / 20000) ** 0.5)
    torch.testing.assert_close(observed.mean(0), torch.zeros(8), rtol=0, atol=4 * se)
    torch.testing.assert_close(observed.var(0), expected, rtol=0.05, atol=0)


def test_predictions_vary_only_after_collection_and_survive_a_state_dict_round_trip():
    torch.manual_seed(0)
    cfg = SWAGConfig(**SMALL, max_rank=4, swa_start=0.5)
    model, x = cfg.build(), torch.randn(5, 2)
    mu, _ = model.moments(x, 3)
    assert torch.equal(mu[0], mu[1])  # nothing collected: the current weights
    model.on_epoch_end(1, 4)  # epoch 1 of 4 is not past swa_start * 4 = 2: nothing collected
    assert int(model.models[0].n_collected) == 0
    for epoch in (3, 4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        model.on_epoch_end(epoch, 4)
    assert int(model.models[0].n_collected) == 2
    a = model.moments(x, 6, torch.Generator().manual_seed(3))[0]
    assert a.var(0).mean() > 0
    clone = cfg.build()
    clone.load_state_dict(model.state_dict())
    assert torch.equal(clone.moments(x, 6, torch.Generator().manual_seed(3))[0], a)


def test_multiswag_mixes_independent_swag_models_round_robin():
    torch.manual_seed(0)
    model = MultiSWAGConfig(**SMALL, n_models=3, max_rank=2, swa_start=0.0).build()
    x = torch.randn(4, 2)
    mu, var = model.moments(x, 6)  # nothing collected: sample s is model s mod 3's current weights
    for s in range(6):
        torch.testing.assert_close(mu[s], model.models[s % 3].net(x) * model.y_scale + model.y_loc)
    assert not torch.allclose(mu[0], mu[1]) and torch.equal(var, torch.zeros_like(var))
    model.on_epoch_end(1, 1)
    assert all(int(m.n_collected) == 1 for m in model.models)
