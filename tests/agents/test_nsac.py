"""NSAC: the OU closed form against Euler-Maruyama, input-dependent positive gates, gradients, top-K = dense, loss."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from agents.encoders import EncoderConfig
from agents.layers.nsac_attention import NSACAttention, ou_moments
from agents.layers.nsac_kernels import TOPK_MAX_KEYS, TOPK_MAX_SLOTS, MixKeys, PairGates, tanh_, top_k_indices
from agents.nsac import NSACConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _euler_maruyama(kappa, phi, psi, t, n_paths, n_steps, seed):
    """Paths of da = kappa (phi - a) dt + psi dW from a(0) = 0, simulated step by step."""
    g = torch.Generator().manual_seed(seed)
    kappa, phi, psi, t = (torch.as_tensor(v, dtype=torch.float32).reshape(-1, 1) for v in (kappa, phi, psi, t))
    dt = t / n_steps
    a = torch.zeros(kappa.shape[0], n_paths)
    noise = torch.empty_like(a)
    for _ in range(n_steps):
        a += kappa * (phi - a) * dt + psi * dt.sqrt() * noise.normal_(generator=g)
    return a


def _relerr(est, ref):
    return ((est - ref).abs() / ref.abs()).max().item()


def test_ou_closed_form_matches_euler_maruyama():
    kappa, phi, psi, t = 1.5, 0.6, 0.8, 0.8
    a = _euler_maruyama(kappa, phi, psi, t, n_paths=1 << 18, n_steps=400, seed=0)
    mu, var = ou_moments(*(torch.tensor([v]) for v in (kappa, phi, psi, t)))
    assert _relerr(a.mean(1), mu) < 0.01
    assert _relerr(a.var(1), var) < 0.01


@pytest.mark.slow
def test_ou_closed_form_matches_euler_maruyama_over_a_range_of_gates():
    kappa, phi, psi, t = [0.05, 0.3, 2.0, 6.0], [0.8, -0.5, 0.6, -0.9], [0.4, 1.2, 0.7, 2.0], [1.0, 0.7, 0.4, 0.9]
    a = _euler_maruyama(kappa, phi, psi, t, n_paths=1 << 19, n_steps=1000, seed=1)
    mu, var = ou_moments(*(torch.tensor(v) for v in (kappa, phi, psi, t)))
    assert _relerr(a.mean(1), mu) < 0.01
    assert _relerr(a.var(1), var) < 0.01


def test_ou_moments_limits():
    kappa = torch.tensor([1e-7, 1.0, 50.0], dtype=torch.float64)
    phi, psi = torch.full_like(kappa, 0.5), torch.full_like(kappa, 2.0)
    mu, var = ou_moments(kappa, phi, psi, 1.0)
    assert var[0].item() == pytest.approx(4.0, rel=1e-5)  # kappa -> 0: Brownian motion, var = psi^2 t
    assert mu[2].item() == pytest.approx(0.5) and var[2].item() == pytest.approx(4.0 / 100)  # stationary
    assert mu[1].item() == pytest.approx(0.5 * (1 - math.exp(-1)))


def _layer(**kw):
    torch.manual_seed(0)
    return NSACAttention(32, n_heads=4, **kw)


def test_layer_logits_follow_the_ou_closed_form_of_its_gates():
    layer = _layer(top_k=5)
    x = torch.randn(2, 9, 32)
    layer(x, samples=1)
    st = layer.internals()
    mu, var = ou_moments(st["kappa"], st["phi"], st["psi"], st["t"].transpose(-1, -2))
    torch.testing.assert_close(st["mu"], mu)
    torch.testing.assert_close(st["sigma2"], var)
    g = torch.Generator().manual_seed(3)
    n = 5000
    logits = layer.sample_logits(st["mu"], st["sigma2"], n, g)  # (B, H, S, n, K): samples on axis 2
    torch.testing.assert_close(logits.mean(2), st["mu"], atol=4 * (var.max().sqrt() / n**0.5).item(), rtol=0)
    assert _relerr(logits.var(2).mean(), st["sigma2"].mean()) < 0.03


def test_gates_are_positive_and_depend_on_the_input():
    layer = _layer(top_k=6)
    for scale in (1.0, 1e3, 1e-3):
        layer(torch.randn(3, 10, 32) * scale)
        st = layer.internals()
        assert (st["kappa"] > 0).all() and (st["psi"] > 0).all()
        assert (st["phi"].abs() <= 1).all()
    layer(torch.randn(3, 10, 32))
    st = layer.internals()
    for name in ("kappa", "phi", "psi"):
        assert st[name].std() > 1e-3, f"{name} is constant over pairs"  # the authors' code: constant
    first = {k: v.clone() for k, v in st.items()}
    layer(torch.randn(3, 10, 32))
    for name in ("kappa", "phi", "psi"):
        assert not torch.allclose(first[name], layer.internals()[name]), f"{name} did not change with the input"


def test_wiring_masks_are_sparse_buffers_and_masked_weights_get_no_gradient():
    layer = _layer(top_k=4)
    buffers = dict(layer.named_buffers())
    params = dict(layer.named_parameters())
    for name in ("q_proj", "k_proj", "v_proj", "inter", "command", "motor"):
        mask = buffers[f"{name}.mask"]
        assert f"{name}.mask" not in params and f"{name}.mask" in layer.state_dict()
        assert 0 < mask.mean() < 1
    layer(torch.randn(2, 7, 32)).sum().backward()
    for name in ("q_proj", "inter", "command", "motor"):
        mod = getattr(layer, name)
        assert (mod.weight.grad * (1 - mod.mask)).abs().max() == 0


def test_gradients_reach_every_gate_and_the_time_constants():
    layer = _layer(top_k=4)
    x = torch.randn(3, 8, 32)
    out = layer(x, samples=2, generator=torch.Generator().manual_seed(0))
    (out**2).mean().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"no gradient reaches {name}"
    for row, gate in enumerate(("kappa", "phi", "psi")):  # motor neuron i drives gate i
        assert layer.motor.weight.grad[row].abs().sum() > 0, f"no gradient through {gate}"
        assert layer.motor.bias.grad[row] != 0, f"no gradient through {gate}"


@pytest.mark.parametrize("readout", [0, 3, 64])  # none; folded P <= d/H; head-wide values
def test_top_k_with_k_equal_n_equals_the_dense_computation(readout):
    layer = _layer(top_k=None)
    x = torch.randn(2, 11, 32)
    head = (torch.randn(readout, 64), torch.randn(readout)) if readout else None
    dense = layer(x, 6, torch.Generator().manual_seed(5), readout=head)
    dense_state = layer.internals()
    layer.top_k = 11
    sparse = layer(x, 6, torch.Generator().manual_seed(5), readout=head)
    assert torch.equal(sparse, dense)  # K >= n runs the dense path: equal bits
    for name, value in layer.internals().items():
        assert torch.equal(value, dense_state[name]), name


def _reference_output(layer, x, top_k, eps=None):
    """Attention built the slow way with plain autograd: every [q_i; k_j] pair through the plain backbone, top-K by
    masking. eps (B, H, S, n_q, n_k): the noise of each (query, key) logit; None = the mean logits (S = 1)."""
    b, n, d = x.shape
    h, dh = layer.n_heads, layer.d_head
    q, k, v = (p(x).view(b, n, h, dh).transpose(1, 2) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    pairs = torch.cat([q.unsqueeze(3).expand(b, h, n, n, dh), k.unsqueeze(2).expand(b, h, n, n, dh)], -1)
    z = layer.motor(torch.tanh(layer.command(torch.tanh(layer.inter(pairs)))))  # (B, H, n_q, n_k, 3)
    kappa = F.softplus(z[..., 0]) + layer.kappa_min
    psi = F.softplus(z[..., 2]) + layer.psi_min
    t = torch.sigmoid(layer.t_b - layer.t_a).view(1, h, 1, 1)
    mu, var = ou_moments(kappa, torch.tanh(z[..., 1]), psi, t)
    logits = mu.unsqueeze(2) if eps is None else mu.unsqueeze(2) + layer.noise_scale * var.sqrt().unsqueeze(2) * eps
    keep = torch.zeros_like(mu, dtype=torch.bool).scatter_(-1, (q @ k.transpose(-1, -2)).topk(top_k, -1).indices, True)
    alpha = torch.softmax(logits.masked_fill(~keep.unsqueeze(2), float("-inf")), -1)  # (B, H, S, n_q, n_k)
    return layer.out_proj((alpha @ v.unsqueeze(2)).permute(2, 0, 3, 1, 4).reshape(-1, b, n, d))  # (S, B, n, 2d)


@pytest.mark.parametrize("top_k", [1, 3, 7])
def test_top_k_matches_a_masked_dense_reference(top_k):
    layer = _layer(top_k=top_k)
    x = torch.randn(2, 9, 32)
    out = layer(x, sample=False)[0]
    torch.testing.assert_close(out, _reference_output(layer, x, top_k)[0], atol=1e-5, rtol=1e-4)
    chosen = layer.internals()["keys"]  # (B, H, n, K), highest score first
    b, n, d = x.shape
    q, k = (p(x).view(b, n, 4, d // 4).transpose(1, 2) for p in (layer.q_proj, layer.k_proj))
    scores = q @ k.transpose(-1, -2)  # (B, H, n, n)
    picked = scores.gather(-1, chosen)
    assert chosen.shape[-1] == top_k and (picked.diff(dim=-1) <= 0).all()
    torch.testing.assert_close(picked, scores.topk(top_k, -1).values)


@pytest.mark.parametrize(("samples", "top_k"), [(1, 4), (3, 4), (2, None)])
def test_sampled_forward_and_hand_written_backward_match_plain_autograd(samples, top_k):
    """The whole layer (in-place gates, custom backward nodes, key-slot mixing) against the plain-autograd reference
    fed the same noise: outputs and every parameter's gradient."""
    layer = _layer(top_k=top_k)
    x = torch.randn(2, 9, 32)
    out = layer(x, samples, torch.Generator().manual_seed(7))
    keys = layer.internals()["keys"]  # (B, H, n, K)
    b, h, n, k = keys.shape
    eps = torch.empty(b, h, samples, k, n).normal_(generator=torch.Generator().manual_seed(7))  # the layer's draw
    dense = torch.zeros(b, h, samples, n, n).scatter_(
        -1, keys.unsqueeze(2).expand(b, h, samples, n, k), eps.transpose(-1, -2)
    )  # noise of slot k of query i at (query i, key keys[.., i, k])
    reference = _reference_output(layer, x, k, dense)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-4)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), list(layer.parameters()))
    ref_grads = torch.autograd.grad((reference * weights).sum(), list(layer.parameters()))
    for (name, _), got, want in zip(layer.named_parameters(), grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4, msg=name)


def test_pair_gates_backward_passes_gradcheck():
    g = torch.Generator().manual_seed(0)
    b, h, n, n_keys, n_inter, n_command = 2, 2, 3, 2, 3, 2

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)

    per_key, per_query = rand(n_inter, b * n * h), rand(n_inter, b, h, n)
    weights = rand(n_command, n_inter), rand(n_command), rand(3, n_command), rand(3)
    rows = torch.randint(0, b * n * h, (b * h * n_keys * n,), generator=g)
    for r in (rows, None):  # selected keys; every key (K = n)
        assert torch.autograd.gradcheck(
            lambda *a, r=r: PairGates.apply(a[0], a[1], r, *a[2:], 1e-3, 1e-4), (per_key, per_query, *weights)
        )
    # and the forward is the plain formula
    kappa, phi, psi = PairGates.apply(per_key, per_query, rows, *weights, 1e-3, 1e-4)
    w_c, b_c, w_m, b_m = weights
    inter = torch.tanh(per_key[:, rows].view(n_inter, b, h, n_keys, n) + per_query.unsqueeze(3))
    z = torch.einsum(
        "mc,cbhki->mbhki", w_m, torch.tanh(torch.einsum("ci,ibhkj->cbhkj", w_c, inter) + b_c.view(-1, 1, 1, 1, 1))
    )
    z = z + b_m.view(-1, 1, 1, 1, 1)
    torch.testing.assert_close(kappa, F.softplus(z[0]) + 1e-3)
    torch.testing.assert_close(phi, torch.tanh(z[1]))
    torch.testing.assert_close(psi, F.softplus(z[2]) + 1e-4)


@pytest.mark.parametrize("samples", [1, 3])
def test_mix_keys_matches_the_gathered_sum_and_passes_gradcheck(samples):
    g = torch.Generator().manual_seed(1)
    b, h, n_keys, n, width = 2, 2, 3, 4, 3
    alpha = torch.rand(b, h, samples, n_keys, n, generator=g, dtype=torch.float64, requires_grad=True)
    values = torch.randn(width, b * n * h, generator=g, dtype=torch.float64, requires_grad=True)
    rows = torch.randint(0, b * n * h, (n_keys, b * h * n), generator=g)
    out = MixKeys.apply(alpha, values, rows)  # (F, B, H, S, n)
    picked = values[:, rows].view(width, n_keys, b, h, 1, n)  # value of slot k of every query
    want = (alpha.permute(3, 0, 1, 2, 4).unsqueeze(0) * picked).sum(1)
    torch.testing.assert_close(out, want)
    assert torch.autograd.gradcheck(lambda a, v: MixKeys.apply(a, v, rows), (alpha, values))


def test_top_k_indices_equals_torch_topk_with_ties_to_the_lower_index():
    g = torch.Generator().manual_seed(2)
    for n, k in ((5, 2), (64, 8), (200, 8), (600, 8), (64, 40)):  # the last two: torch.topk fallback
        scores = torch.randint(-3, 4, (50, n), generator=g).float()  # many ties
        scores[0, :3] = torch.tensor([0.0, -0.0, 0.0])
        idx = top_k_indices(scores, k)
        assert idx.dtype == torch.long and idx.shape == (50, k)
        picked = scores.gather(-1, idx)
        torch.testing.assert_close(picked, scores.topk(k, -1).values, rtol=0, atol=0)
        if n <= TOPK_MAX_KEYS and k <= TOPK_MAX_SLOTS:  # documented tie order: lower key index first
            tied = picked[:, 1:] == picked[:, :-1]
            assert (idx[:, 1:] > idx[:, :-1])[tied].all()
    scores = torch.randn(4, 3, 30, generator=g).half()
    torch.testing.assert_close(top_k_indices(scores, 5), scores.float().topk(5, -1).indices)


def test_tanh_in_place_equals_torch_tanh():
    x = torch.linspace(-12, 12, 10001)
    torch.testing.assert_close(tanh_(x.clone()), torch.tanh(x), atol=3e-7, rtol=0)
    x = x.double()
    torch.testing.assert_close(tanh_(x.clone()), torch.tanh(x), atol=1e-15, rtol=0)


def test_noise_is_independent_per_batch_element_and_seeded():
    layer = _layer(top_k=3)
    x = torch.randn(1, 6, 32).expand(2, 6, 32)  # the same example twice
    mean = layer(x, sample=False)
    assert torch.equal(mean[:, 0], mean[:, 1])
    draws = layer(x, 4, torch.Generator().manual_seed(3))
    assert not torch.allclose(draws[:, 0], draws[:, 1])  # each example its own noise
    assert torch.equal(draws, layer(x, 4, torch.Generator().manual_seed(3)))
    with torch.no_grad():  # the in-place no-graph path draws and scales the same numbers
        torch.testing.assert_close(layer(x, 4, torch.Generator().manual_seed(3)), draws, rtol=0, atol=0)


@pytest.mark.parametrize("top_k", [3, None])
@pytest.mark.parametrize("width", [2, 64])  # folded P-vectors per key (P <= d/H); head-wide values then (P, d)
def test_pooled_readout_equals_pooling_the_token_outputs(top_k, width):
    layer = _layer(top_k=top_k)
    x = torch.randn(4, 6, 32)
    w, c = torch.randn(width, 64), torch.randn(width)
    tokens = layer(x, 5, torch.Generator().manual_seed(1))
    pooled = layer(x, 5, torch.Generator().manual_seed(1), readout=(w, c))
    torch.testing.assert_close(pooled, tokens.mean(2) @ w.T + c, atol=1e-5, rtol=1e-4)


def test_time_input_and_noise_scale():
    layer = _layer(top_k=3, noise_scale=0.0)
    x = torch.randn(2, 5, 32)
    out = layer(x, 4)
    assert torch.allclose(out, out[:1].expand_as(out))  # no noise: every sample the same
    layer.noise_scale = 1.0
    assert not torch.allclose(*layer(x, 2).unbind(0))
    with torch.no_grad():
        layer.t_a.fill_(2.0)
    layer(x, t_sample=torch.tensor([[0.0] * 5, [3.0] * 5]))
    t = layer.internals()["t"]
    assert t.shape == (2, 4, 1, 5) and (t[0] > t[1]).all()  # t = sigmoid(-t_a t_sample + t_b)
    with pytest.raises(ValueError, match="t_sample"):
        layer(x, t_sample=torch.ones(3))
    assert NSACAttention(32).noise_scale == 1.0  # default: the paper's variance


# -- the controller -----------------------------------------------------------------------------------------------


def _controller(**kw):
    torch.manual_seed(0)
    return NSACConfig(encoder=EncoderConfig(kind="sequence", in_dim=3, n_tokens=6, d_model=32), **kw).build()


def test_controller_moments_internals_and_defaults():
    model = _controller(out_dim=2)
    x = torch.randn(5, 6, 3)
    mu, var = model.moments(x, 7, torch.Generator().manual_seed(0))
    assert mu.shape == var.shape == (7, 5, 2) and (var > 0).all()
    pred = model.predict(x)
    assert (pred.epistemic_var > 0).all() and model.default_samples == 32
    st = model.internals()
    for name in ("kappa", "phi", "psi", "mu", "sigma2"):
        assert st[name].shape == (5, 4, 6, 6)  # (B, H, n, K): K = min(8, n)
    assert st["attention"].shape == (32, 5, 4, 6, 6)
    torch.testing.assert_close(st["attention"].sum(-1), torch.ones(32, 5, 4, 6))
    a, _ = model.moments(x, 3, torch.Generator().manual_seed(9))
    b, _ = model.moments(x, 3, torch.Generator().manual_seed(9))
    assert torch.equal(a, b)


def test_default_sample_count_is_a_config_field_and_old_configs_load_with_32():
    from agents.registry import config_from_dict, config_to_dict

    model = _controller(n_samples=5)
    assert model.default_samples == 5
    assert model.moments(torch.randn(2, 6, 3), model.default_samples)[0].shape[0] == 5
    old = config_to_dict(NSACConfig())
    del old["n_samples"]  # a checkpoint saved while the count was a class attribute
    assert config_from_dict("nsac", old).n_samples == 32
    with pytest.raises(ValueError, match="n_samples"):
        NSACConfig(n_samples=0)


@pytest.mark.parametrize(("form", "pairs"), [("anchored", True), ("paper", False), ("anchored", False)])
def test_loss_is_the_nll_of_the_mean_plus_the_documented_regulariser(form, pairs):
    model = _controller(out_dim=1, n_passes=3, reg_weight=0.5, reg_form=form, reg_pairs=pairs)
    x, y = torch.randn(16, 6, 3), torch.randn(16, 1)
    torch.manual_seed(3)
    loss = model.loss(x, y)
    parts = model.last_loss
    # replay the same draws: clean passes, the surrogate, its passes
    torch.manual_seed(3)
    tokens, normed = model._encode(x)
    mu, var = model._attend(x, tokens, normed, 3, None)
    x_ood = model.ood_inputs(x)
    mu_ood, _ = model._attend(x_ood, *model._encode(x_ood), 3, None)
    epi_id, epi_ood = mu.var(0, unbiased=False).mean(-1), mu_ood.var(0, unbiased=False).mean(-1)  # (B,)
    if not pairs:
        epi_id, epi_ood = epi_id.mean(), epi_ood.mean()
    eps = model.cfg.reg_eps
    reg = torch.log1p((epi_id + (eps if form == "anchored" else 0.0)) / (epi_ood + eps)).mean().item()
    assert parts["reg"] == pytest.approx(reg, rel=1e-5)
    assert loss.item() == pytest.approx(parts["nll"] + 0.5 * reg, rel=1e-5)
    assert parts["epi_id"] > 0 and parts["epi_ood"] > 0  # N >= 2 passes: the regulariser is alive
    # the NLL is that of the passes' mean prediction (population variance over the passes, as the authors)
    y_std = model._standardise(y)
    m, v = mu.mean(0), (var + model.cfg.var_eps).mean(0)
    nll = (0.5 * torch.log(2 * math.pi * v) + (y_std - m) ** 2 / (2 * v)).mean()
    assert parts["nll"] == pytest.approx(nll.item(), rel=1e-5)
    assert parts["epi_id"] == pytest.approx(mu.var(0, unbiased=False).mean().item(), rel=1e-5)
    with pytest.raises(ValueError, match="n_passes"):
        NSACConfig(n_passes=1)
    NSACConfig(n_passes=1, reg_weight=0.0)  # allowed without the regulariser
    with pytest.raises(ValueError, match="reg_form"):
        NSACConfig(reg_form="other")


def test_ood_surrogate_is_per_head_and_relative_to_each_heads_features():
    model = _controller(out_dim=1, ood_scale=0.5)
    normed = torch.randn(256, 6, 32) * torch.tensor([1.0, 4.0, 0.1, 2.0]).repeat_interleave(8)  # 4 heads of 8
    torch.manual_seed(0)
    noise = (model.ood_tokens(normed) - normed).unflatten(-1, (4, 8))
    ratio = noise.transpose(0, 2).flatten(1).std(1) / normed.unflatten(-1, (4, 8)).transpose(0, 2).flatten(1).std(1)
    torch.testing.assert_close(ratio, torch.full((4,), 0.5), atol=0.02, rtol=0)


def test_input_surrogate_is_pixel_noise_or_a_gain_and_offset_per_frame():
    cfg = NSACConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=2)
    model = dataclasses.replace(cfg, ood_valid=False).build()  # the raw draws; the valid surrogate is tested below
    x = torch.randint(0, 256, (400, 4, 12, 12), dtype=torch.uint8)
    torch.manual_seed(0)
    xf = x.float()
    diff = (model.ood_inputs(x) - xf).flatten(2)  # (B, frames, pixels)
    # per frame, an affine map of the frame leaves no residual; pixel noise leaves std 0.3 x the input std
    design = torch.stack([xf.flatten(2), torch.ones_like(xf.flatten(2))], -1)  # (B, F, P, 2)
    coef = torch.linalg.lstsq(design, diff.unsqueeze(-1)).solution
    residual = (diff.unsqueeze(-1) - design @ coef).squeeze(-1).std(-1).mean(-1)  # (B,)
    affine = residual < 1.0
    assert 0.4 < affine.float().mean() < 0.6
    assert residual[~affine].mean() == pytest.approx(0.3 * xf.std().item(), rel=0.05)
    gains = coef[affine][..., 0, 0] + 1  # (n_affine, frames)
    assert gains.mean() == pytest.approx(1.0, abs=0.05) and gains.std() == pytest.approx(0.5, rel=0.1)


def test_input_surrogate_of_uint8_frames_is_a_valid_frame():
    """Out-of-range pixels are a shortcut: a surrogate with values below 0 or above 255 is told apart from every
    real frame by them, whatever it does to the picture (the 130-episode model learned exactly that)."""
    cfg = NSACConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=2)
    valid, raw = cfg.build(), dataclasses.replace(cfg, ood_valid=False).build()
    x = torch.randint(0, 256, (64, 4, 12, 12), dtype=torch.uint8)
    torch.manual_seed(0)
    a = valid.ood_inputs(x)
    torch.manual_seed(0)
    b = raw.ood_inputs(x)
    assert b.min() < 0 and b.max() > 255  # the raw surrogate leaves the pixel range
    assert a.min() >= 0 and a.max() <= 255 and torch.equal(a, a.round())
    torch.testing.assert_close(a, b.round().clamp(0, 255))  # same draws, only made valid
    xf = torch.randn(8, 6, 3)  # float inputs (features, sequences) have no range: untouched
    torch.manual_seed(1)
    c = valid.ood_inputs(xf)
    torch.manual_seed(1)
    torch.testing.assert_close(c, raw.ood_inputs(xf))


def test_tiny_overfit_lowers_the_loss_and_state_dict_round_trip():
    model = _controller(out_dim=1)
    x = torch.randn(32, 6, 3)
    y = x[:, :, 0].mean(1, keepdim=True) * 2
    opt = torch.optim.Adam(model.parameters(), 5e-3)
    torch.manual_seed(1)

    def mean_loss():  # the loss is stochastic (passes, surrogate): its mean over a few draws
        with torch.no_grad():
            return sum(model.loss(x, y).item() for _ in range(8)) / 8

    first = mean_loss()
    for _ in range(80):
        opt.zero_grad()
        model.loss(x, y).backward()
        opt.step()
    assert mean_loss() < first - 0.5
    clone = _controller(out_dim=1)
    clone.load_state_dict(model.state_dict())
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert torch.equal(model.moments(x, 4, g1)[0], clone.moments(x, 4, g2)[0])


def test_time_feature_drives_t_sample():
    cfg = NSACConfig(encoder=EncoderConfig(kind="features", in_dim=3, d_model=16), n_heads=2, time_feature=0)
    model = cfg.build()
    with torch.no_grad():
        model.attention.t_a.fill_(1.0)
    x = torch.randn(4, 3)
    model.moments(x, 2)
    t = model.internals()["ou_time"]  # (B, H, 1, 1): one time per example, shared by its tokens
    assert t.shape == (4, 2, 1, 1)
    torch.testing.assert_close(t[:, 0, 0, 0], torch.sigmoid(-x[:, 0]))
    with pytest.raises(ValueError, match="time_feature"):
        NSACConfig(encoder=EncoderConfig(kind="frames"), time_feature=0)


def test_bench_attention_runs_and_writes_its_figures(tmp_path, capfd):
    import json

    from drive.cli import main

    out = tmp_path / "bench.json"
    args = ["--tokens", "8", "32", "--batch", "2", "--repeats", "1", "--warmup", "0", "--samples", "3"]
    assert main(["bench", "attention", "--out", str(out), *args]) == 0
    result = json.loads(out.read_text())
    assert [r["n"] for r in result["attention"]] == [8, 32]
    for row in result["attention"]:
        assert row["nsac_cpu_ms"] > 0 and row["nsac_peak_mib"] > 0 and row["sdpa_block_peak_mib"] > 0
    for entry in result["sampling"]:
        assert entry["pooled_ratio"] > 0 and entry["pooled_2d_ratio"] > 0 and entry["floor_ratio"] > 1
    assert "profile_memory" in result["method"]["memory"]
    assert "profiler_start" not in capfd.readouterr().err  # the profiler's chatter is dropped
