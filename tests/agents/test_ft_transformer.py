"""FT-Transformer: the architecture Gorishniy et al. specify, and SA on it (mean-preserving, dispersion ~ 1/nu,
independent draws per head, query row and pass, every block reached, attention dropout off at inference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import agents.layers.stochastic_attention as sa_module
from agents.encoders import EncoderConfig
from agents.ft_transformer import FTTransformerConfig, Noise, no_decay_groups
from agents.layers.stochastic_attention import stochastic_attention
from agents.sa import sa_samples

pytestmark = pytest.mark.usefixtures("one_thread")

ENC = EncoderConfig(kind="ft_features", in_dim=6, d_model=32)


def point(model, x):
    return model.moments(x, 1)[0][0]  # the deterministic prediction f(x), (B, D)


def _model(**kw):
    torch.manual_seed(0)
    return FTTransformerConfig(encoder=ENC, out_dim=2, n_heads=4, **kw).build().eval()


def _x(n=4, seed=1):
    return torch.randn(n, ENC.in_dim, generator=torch.Generator().manual_seed(seed)) * 2


def test_the_papers_architecture_and_defaults():
    cfg = FTTransformerConfig()
    assert (cfg.encoder.kind, cfg.encoder.d_model, cfg.n_blocks, cfg.n_heads) == ("ft_features", 192, 3, 8)
    assert (cfg.attention_dropout, cfg.ffn_dropout, cfg.residual_dropout) == (0.2, 0.1, 0.0)
    model = cfg.build()
    assert model.net.blocks[0].hidden == 256  # ReGLU width d * 4/3
    assert isinstance(model.net.blocks[0].attention_norm, nn.Identity)  # no LN before the first attention
    assert all(isinstance(b.attention_norm, nn.LayerNorm) for b in model.net.blocks[1:])
    small = _model()
    x = _x()
    tokens = small.net.tokens(x)  # (B, F + 1, d): linear feature tokens, CLS appended last
    assert tokens.shape == (4, 7, 32) and torch.equal(tokens[:, -1], small.net.cls.expand(4, -1))
    linear = small.net.tokens(2 * x)[:, :-1] - tokens[:, :-1]  # = x_j W_j: no activation
    torch.testing.assert_close(linear, x.unsqueeze(-1) * small.net.tokenizer.weight)
    decay, no_decay = no_decay_groups(small.net, 1e-5)
    names = {id(p): n for n, p in small.net.named_parameters()}
    assert all(names[id(p)].endswith("weight") and "norm" not in names[id(p)] for p in decay["params"])
    assert {names[id(p)] for p in no_decay["params"]} >= {"cls", "tokenizer.weight", "head_norm.weight", "head.bias"}


def test_prediction_is_deterministic_in_either_mode_and_attention_dropout_is_off():
    model, x = _model(), _x()
    same_weights = _model(attention_dropout=0.0, ffn_dropout=0.0)
    for mode in (model.train, model.eval):
        mode()
        assert torch.equal(point(model, x), point(model, x))
        torch.testing.assert_close(point(model, x), point(same_weights, x))
    assert not torch.equal(model.net(x, Noise(dropout=True)), point(model, x))  # the loss's training dropout


def test_sa_reaches_every_block_with_independent_draws_per_head_query_row_and_pass(monkeypatch):
    model, x = _model(), _x(n=3)
    calls = []
    real = sa_module.multinomial_average

    def recording(probs, nu, generator=None):
        out = real(probs, nu, generator)
        calls.append((probs, out))
        return out

    monkeypatch.setattr(sa_module, "multinomial_average", recording)
    n_passes = 400
    with torch.no_grad():
        sa_samples(model, x, 1, n_passes, torch.Generator().manual_seed(0), forward=point)
    assert [c[0].shape for c in calls] == [(n_passes * 3, 4, 7, 7)] * 2 + [(n_passes * 3, 4, 1, 7)]  # 3 blocks
    probs, picks = calls[0]  # nu = 1: each row is one sampled key, one-hot
    p, c = probs.view(n_passes, 3, 4, 7, 7), picks.view(n_passes, 3, 4, 7, 7)

    def agreement(a, b, pa, pb):  # observed vs independent-draw rate of two rows picking the same key
        return (a * b).sum(-1).mean().item(), (pa * pb).sum(-1).mean().item()

    for observed, expected in (
        agreement(c[:, :, 0], c[:, :, 1], p[:, :, 0], p[:, :, 1]),  # two heads, same query row and pass
        agreement(c[..., 0, :], c[..., 1, :], p[..., 0, :], p[..., 1, :]),  # two query rows
        agreement(c[0::2], c[1::2], p[0::2], p[1::2]),  # two passes of the same input
    ):
        assert observed == pytest.approx(expected, abs=0.03) and expected < 0.5


def test_sa_is_mean_preserving_at_each_attention_and_converges_to_the_deterministic_model():
    model, x = _model(), _x()
    block = model.net.blocks[1]
    with torch.no_grad():
        nn.init.zeros_(block.ffn_out.weight), nn.init.zeros_(block.ffn_out.bias)  # block output linear in the weights
        h = model.net.blocks[0](model.net.tokens(x), last=False, noise=Noise())  # (B, 7, d)
        det = block(h, last=False, noise=Noise())
        reps = 3000
        with stochastic_attention(block, 4, torch.Generator().manual_seed(0)):
            draws = block(h.repeat(reps, 1, 1), last=False, noise=Noise()).view(reps, *det.shape)
    assert (draws.mean(0) - det).abs().max() < 5 * (draws.var(0).max() / reps).sqrt()  # exact per attention

    # Through the non-linear network the bias of the pass average is second order, O(1/nu), the spread O(nu^-1/2):
    # the average of many passes tends to the deterministic output.
    model = _model()
    with torch.no_grad():
        det = point(model, x)
        stats = []
        for nu in (16, 256):
            s = sa_samples(model, x, nu, 4000, torch.Generator().manual_seed(nu), forward=point)  # (R, B, D)
            stats.append(((s.mean(0) - det).abs().mean().item(), s.std(0).mean().item()))
    (bias16, std16), (bias256, std256) = stats
    assert bias256 < bias16 / 5 and bias256 < 0.3 * std256


def test_sa_dispersion_is_proportional_to_one_over_nu():
    """Variance of the passes vs nu on log-log axes: slope -1 (the std's slope is -1/2)."""
    model, x = _model(), _x()
    nus = [64, 256, 1024, 4096]
    with torch.no_grad():
        variances = [
            sa_samples(model, x, nu, 1500, torch.Generator().manual_seed(nu), forward=point).var(0).mean().item()
            for nu in nus
        ]
    assert np.polyfit(np.log(nus), np.log(variances), 1)[0] == pytest.approx(-1.0, abs=0.1)
