"""Every registered controller: the predictive contract, trainability, checkpoints; plus per-method mathematics."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from agents.base import Prediction, total_variance
from agents.encoders import EncoderConfig
from agents.layers.attention import SelfAttention, dropout
from agents.registry import CONTROLLERS, config_to_dict
from drive import checkpoint

ENC = EncoderConfig(kind="features", in_dim=3, d_model=16)
B, D, S = 6, 2, 4


def build(name: str, **overrides):
    cfg = CONTROLLERS[name](encoder=ENC, out_dim=D, **overrides)
    torch.manual_seed(0)
    return cfg, cfg.build()


def batch(seed: int = 0, n: int = B):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, ENC.in_dim, generator=g)
    y = torch.stack([x[:, 0] * 2 + x[:, 1], torch.sin(x[:, 2])], -1) + 5.0  # (n, D), off-centre on purpose
    return x, y


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny models: intra-op threads only add synchronisation, and on a shared 2-core machine they stall badly.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=sorted(CONTROLLERS))
def name(request):
    return request.param


def test_moments_and_prediction_shapes_and_signs(name):
    _, model = build(name)
    x, _ = batch()
    for mode in (model.train, model.eval):
        mode()
        mu, var = model.moments(x, S, torch.Generator().manual_seed(1))
        assert mu.shape == var.shape == (S, B, D)
        assert torch.isfinite(mu).all() and (var >= 0).all()
        pred = model.predict(x, S, torch.Generator().manual_seed(1))
        assert isinstance(pred, Prediction)
        for t in pred:
            assert t.shape == (B, D) and torch.isfinite(t).all()
        assert (pred.aleatoric_var >= 0).all() and (pred.epistemic_var >= 0).all()


def test_seeded_generator_makes_predictions_reproducible(name):
    _, model = build(name)
    model.eval()
    x, _ = batch()
    a = model.predict(x, S, torch.Generator().manual_seed(7))
    b = model.predict(x, S, torch.Generator().manual_seed(7))
    for ta, tb in zip(a, b, strict=True):
        assert torch.equal(ta, tb)


def test_loss_gives_finite_gradients(name):
    _, model = build(name)
    x, y = batch()
    loss = model.loss(x, y)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads, "no parameter received a gradient"
    assert all(torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0


def test_tiny_overfit_lowers_the_loss(name):
    _, model = build(name)
    x, y = batch(n=16)
    model.set_target_stats(y.mean(0), y.std(0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    losses = []
    for _ in range(80):
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.3, f"{name}: loss {first:.3f} -> {last:.3f}"


def test_checkpoint_round_trip_gives_identical_predictions(name, tmp_path):
    cfg, model = build(name)
    model.set_target_stats(torch.tensor([1.0, -2.0]), torch.tensor([3.0, 0.5]))
    path = checkpoint.save(tmp_path / "c.pt", kind="controller", name=name, config=config_to_dict(cfg), module=model)
    loaded, payload = checkpoint.load_controller(path)
    assert payload["name"] == name
    model.eval()
    x, _ = batch(3)
    a = model.predict(x, S, torch.Generator().manual_seed(5))
    b = loaded.predict(x, S, torch.Generator().manual_seed(5))
    for ta, tb in zip(a, b, strict=True):
        assert torch.equal(ta, tb)


def test_wrong_kind_and_corrupt_checkpoints_raise_clear_errors(name, tmp_path):
    cfg, model = build(name)
    path = checkpoint.save(tmp_path / "e.pt", kind="expert", name=name, config=config_to_dict(cfg), module=model)
    with pytest.raises(checkpoint.CheckpointError, match="is an expert .drive expert train., but a trained controller"):
        checkpoint.load_controller(path)
    good = checkpoint.save(tmp_path / "g.pt", kind="controller", name=name, config=config_to_dict(cfg), module=model)
    truncated = tmp_path / "t.pt"
    truncated.write_bytes(good.read_bytes()[:200])
    with pytest.raises(checkpoint.CheckpointError, match="t.pt: not a readable drive checkpoint"):
        checkpoint.load_controller(truncated)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(checkpoint.CheckpointError, match="garbage.pt"):
        checkpoint.load_controller(garbage)


def test_checkpoint_with_mismatched_weights_raises(name, tmp_path):
    cfg, model = build(name)
    other = dataclasses.replace(cfg, encoder=dataclasses.replace(ENC, d_model=32))
    path = checkpoint.save(tmp_path / "m.pt", kind="controller", name=name, config=config_to_dict(other), module=model)
    with pytest.raises(checkpoint.CheckpointError, match="do not match"):
        checkpoint.load_controller(path)


# -- the shared attention block ----------------------------------------------------------------------------------------
def test_self_attention_equals_a_manual_softmax_attention():
    torch.manual_seed(0)
    layer = SelfAttention(16, n_heads=4)
    x = torch.randn(3, 5, 16)
    h = layer.norm(x)
    q, k, v = layer.qkv(h).chunk(3, -1)
    split = lambda t: t.view(3, 5, 4, 4).transpose(1, 2)  # noqa: E731  (B, H, T, dh)
    weights = torch.softmax(split(q) @ split(k).transpose(-1, -2) / 2.0, -1)  # sqrt(dh) = 2
    expected = x + layer.out((weights @ split(v)).transpose(1, 2).reshape(3, 5, 16))
    torch.testing.assert_close(layer(x), expected)


def test_dropout_is_active_in_eval_and_reproducible_by_generator():
    x = torch.ones(1000)
    a = dropout(x, 0.25, torch.Generator().manual_seed(1))
    b = dropout(x, 0.25, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert 0.2 < (a == 0).float().mean() < 0.3
    assert a.mean().item() == pytest.approx(1.0, abs=0.1)  # inverted dropout keeps the mean
    assert torch.equal(dropout(x, 0.0), x)


# -- per-method mathematics --------------------------------------------------------------------------------------------
def test_gmle_has_no_epistemic_variance():
    _, model = build("gmle")
    pred = model.predict(batch()[0], 8)
    assert torch.equal(pred.epistemic_var, torch.zeros_like(pred.epistemic_var))


def test_mc_dropout_samples_differ_in_eval_mode():
    _, model = build("mcd")
    model.eval()
    mu, _ = model.moments(batch()[0], 8, torch.Generator().manual_seed(0))
    assert mu.var(0).mean() > 0


def test_ensemble_samples_are_its_members_round_robin():
    _, model = build("de", n_members=3)
    x, _ = batch()
    mu, var = model.moments(x, 5)
    for s in range(5):
        m_mu, m_var = model.members[s % 3](x)
        torch.testing.assert_close(mu[s], m_mu * model.y_scale + model.y_loc)
        torch.testing.assert_close(var[s], m_var * model.y_scale**2)
    assert not torch.allclose(mu[0], mu[1])  # independently initialised members disagree
    exact = total_variance(*model.moments(x, 3))
    for a, b in zip(model.predict(x, 8), exact, strict=True):  # predict: all members once, whatever S
        torch.testing.assert_close(a, b)


def test_evidential_closed_form_matches_monte_carlo_over_the_nig():
    _, model = build("der")
    model.set_target_stats(torch.tensor([1.0, 2.0]), torch.tensor([2.0, 0.5]))
    with torch.no_grad():
        model.head.bias.copy_(torch.tensor([0.0, 0.0, 1.0, 1.0, 4.0, 4.0, 1.0, 1.0]))  # alpha ~ 5: finite moments
    x, _ = batch()
    closed = model.predict(x)
    mc = total_variance(*model.moments(x, 40_000, torch.Generator().manual_seed(0)))
    torch.testing.assert_close(mc.mean, closed.mean, rtol=0.02, atol=0.02)
    torch.testing.assert_close(mc.aleatoric_var, closed.aleatoric_var, rtol=0.03, atol=0)
    torch.testing.assert_close(mc.epistemic_var, closed.epistemic_var, rtol=0.03, atol=0)


def test_evidential_nll_matches_student_t():
    from scipy import stats

    from agents.evidential import nig_nll

    gamma, nu, alpha, beta = 0.3, 2.0, 3.0, 1.5
    scale = (beta * (1 + nu) / (nu * alpha)) ** 0.5  # the NIG marginal is Student-t(2 alpha, gamma, scale)
    expected = -stats.t.logpdf(1.1, df=2 * alpha, loc=gamma, scale=scale)
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    assert nig_nll(t(1.1), t(gamma), t(nu), t(alpha), t(beta)).item() == pytest.approx(expected, rel=1e-9)


def test_gamma_sampler_moments():
    from agents.evidential import sample_gamma

    alpha = torch.full((200_000,), 2.5, dtype=torch.float64)
    draws = sample_gamma(alpha, torch.Generator().manual_seed(0))
    assert draws.mean().item() == pytest.approx(2.5, rel=0.01)
    assert draws.var().item() == pytest.approx(2.5, rel=0.03)


def test_sde_net_diffusion_learns_to_separate_perturbed_inputs():
    _, model = build("sdenet", ood_std=3.0)
    x, y = batch(n=64)
    model.set_target_stats(y.mean(0), y.std(0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        g_in = torch.sigmoid(model.diffusion(model.backbone(x))).mean()
        x_ood = x + 3.0 * x.std() * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
        g_ood = torch.sigmoid(model.diffusion(model.backbone(x_ood))).mean()
        mu, _ = model.moments(x, 16, torch.Generator().manual_seed(0))
        mu_ood, _ = model.moments(x_ood, 16, torch.Generator().manual_seed(0))
    assert g_ood > g_in + 0.3
    assert mu_ood.var(0).mean() > mu.var(0).mean()  # larger diffusion -> larger epistemic spread
    assert F.mse_loss(model.predict(x, 16).mean, y) < F.mse_loss(y.mean(0).expand_as(y), y)


def test_a_slid_frame_stack_reuses_its_row_s_tokens_and_every_token_equals_the_uncached_one():
    """Five cars' stacks slide by one frame per call; car 2 restarts (its first frame four times), a car leaves
    (the rows shift), a frame changes in place (must not be taken for the old one): every call equals the encoder
    without memory, bit for bit, and only rows that did not slide reach the bytes memo."""
    from agents.encoders import EncoderConfig, FrameTokens

    torch.manual_seed(0)
    enc = FrameTokens(EncoderConfig(kind="frames", in_dim=1, n_tokens=4, d_model=8)).eval()
    streams = torch.randint(0, 255, (5, 12, 84, 84), dtype=torch.uint8)  # (car, time, 84, 84)
    batches = [streams[:, n : n + 4].clone() for n in range(6)]  # (5, 4, 84, 84) each
    batches[3][2] = streams[2, 11].expand(4, 84, 84)  # car 2 restarts
    batches[4][2] = torch.stack([streams[2, 11]] * 3 + [streams[2, 10]])
    batches.append(streams[1:, 6:10].clone())  # car 0 left: the rows shift
    batches.append(streams[1:, 7:11].clone())
    batches[-1][0, 1, 40, 40] ^= 1  # one byte of an old frame differs: not the previous call's frame
    with torch.no_grad():
        plain = [enc(x) for x in batches]
        enc.remember_frames(True)
        memo_sizes, cached = [], []
        for x in batches:
            cached.append(enc(x))
            memo_sizes.append(len(enc.memo))
    assert all(torch.equal(a, b) for a, b in zip(plain, cached, strict=True))
    # 0: 5 x 4 new frames; 1, 2: slid; 3: car 2's restart frame; 4: car 2 slid too (its last three frames were
    # the restart frame); 5: car 2's stack of the stream again (4 new); 6: rows shifted, 13 of 16 frames new (car
    # 2's three of call 5 are known); 7: row 0 not slid, its changed frame and its newest one new
    assert memo_sizes == [20, 20, 20, 21, 21, 25, 38, 40]


def test_the_frame_memo_never_evicts_a_frame_of_the_batch_it_is_reading(monkeypatch):
    """A frame seen long ago and seen again (a uniform off-track view) while the memo is full: the tokens are read
    before anything is evicted, the memo keeps the frames used last, and every token equals the uncached one."""
    from agents.encoders import EncoderConfig, FrameTokens

    torch.manual_seed(0)
    enc = FrameTokens(EncoderConfig(kind="frames", in_dim=1, n_tokens=4, d_model=8)).eval()
    monkeypatch.setattr(FrameTokens, "FRAME_MEMO", 6)
    frames = torch.randint(0, 255, (9, 84, 84), dtype=torch.uint8)
    stacks = [frames[0:4], frames[2:6], frames[[0, 6, 7, 8]]]  # the memo is full (0-5) when frame 0 comes back
    with torch.no_grad():
        plain = [enc(s[None]) for s in stacks]
        enc.remember_frames(True)
        cached = [enc(s[None]) for s in stacks]  # the last stack re-reads frame 0, the oldest in a full memo
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, cached, strict=True))
    assert len(enc.memo) == 6 and frames[0].numpy().tobytes() in enc.memo  # used last, so kept
