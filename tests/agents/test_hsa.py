"""HSA: every sampled weight vector lies on the simplex (sums to one over keys, and over centroids), samples differ
between passes, follow the generator, and sharpen to one-hot as the temperature falls."""

from __future__ import annotations

import pytest
import torch

from agents.encoders import EncoderConfig
from agents.hsa import HSAConfig, gumbel_softmax

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = HSAConfig(encoder=EncoderConfig(kind="ft_features", in_dim=5, d_model=16), out_dim=2, n_heads=4, n_centroids=6)


def test_sampled_attention_and_centroid_weights_sum_to_one():
    torch.manual_seed(0)
    model = CFG.build()
    x = torch.randn(3, 5)
    model.moments(x, 2, torch.Generator().manual_seed(0))
    weights = model.internals()
    assert weights["attention_0"].shape == (6, 4, 6, 6)  # (S*B, H, L, T): 5 feature tokens + CLS
    assert weights["attention_2"].shape == (6, 4, 1, 6)  # the last block: the CLS query
    assert weights["centroids_0"].shape == (6, 4, 6, 6)  # (S*B, H, T, K)
    for name, w in weights.items():
        assert (w >= 0).all(), name
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), msg=name)


def test_gumbel_softmax_samples_are_random_reproducible_and_sharpen_with_the_temperature():
    scores = torch.tensor([[1.0, 0.0, -1.0]]).expand(20000, 3)
    a = gumbel_softmax(scores, 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(a, gumbel_softmax(scores, 1.0, torch.Generator().manual_seed(0)))
    assert a.var(0).min() > 1e-3  # random
    torch.testing.assert_close(a.sum(-1), torch.ones(20000))
    cold = gumbel_softmax(scores, 0.01, torch.Generator().manual_seed(1))
    assert (cold.max(-1).values > 0.99).float().mean() > 0.95  # nearly one-hot
    # with tau -> 0 the argmax is a draw from softmax(scores) (the Gumbel-max trick)
    freq = torch.bincount(cold.argmax(-1), minlength=3).float() / 20000
    torch.testing.assert_close(freq, torch.softmax(scores[0], -1), atol=0.015, rtol=0)


def test_prediction_samples_differ_and_follow_the_generator():
    torch.manual_seed(0)
    model = CFG.build().eval()
    x = torch.randn(4, 5)
    mu, var = model.moments(x, 8, torch.Generator().manual_seed(3))
    assert mu.var(0).mean() > 0 and torch.equal(var, torch.zeros_like(var))
    assert torch.equal(mu, model.moments(x, 8, torch.Generator().manual_seed(3))[0])
