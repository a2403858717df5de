"""NSAC: the OU closed form against Euler-Maruyama, input-dependent positive gates, gradients, top-K = dense, loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from agents.encoders import EncoderConfig
from agents.layers.nsac_attention import NSACAttention, ou_moments
from agents.nsac import NSACConfig


@pytest.fixture(autouse=True)
def _one_thread():
    # 2 shared cores: intra-op threads only add contention for these small tensors
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
    layer(x, n_samples=1)
    st = layer.internals()
    mu, var = ou_moments(st["kappa"], st["phi"], st["psi"], st["t"].transpose(-1, -2))
    torch.testing.assert_close(st["mu"], mu)
    torch.testing.assert_close(st["sigma2"], var)
    g = torch.Generator().manual_seed(3)
    n = 5000
    logits = layer.sample_logits(st["mu"], st["sigma2"], n, g)  # (B, S, H, n, K): samples on axis 1
    torch.testing.assert_close(logits.mean(1), st["mu"], atol=4 * (var.max().sqrt() / n**0.5).item(), rtol=0)
    assert _relerr(logits.var(1).mean(), st["sigma2"].mean()) < 0.03


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
    out = layer(x, n_samples=2, generator=torch.Generator().manual_seed(0))
    (out**2).mean().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"no gradient reaches {name}"
    for row, gate in enumerate(("kappa", "phi", "psi")):  # motor neuron i drives gate i
        assert layer.motor.weight.grad[row].abs().sum() > 0, f"no gradient through {gate}"
        assert layer.motor.bias.grad[row] != 0, f"no gradient through {gate}"


@pytest.mark.parametrize("readout", [False, True])
def test_top_k_with_k_equal_n_equals_the_dense_computation(readout):
    layer = _layer(top_k=None)
    x = torch.randn(2, 11, 32)
    head = (torch.randn(3, 64), torch.randn(3)) if readout else None
    dense = layer(x, 6, torch.Generator().manual_seed(5), readout=head)
    dense_state = layer.internals()
    layer.top_k = 11
    sparse = layer(x, 6, torch.Generator().manual_seed(5), readout=head)
    torch.testing.assert_close(sparse, dense)
    for name, value in layer.internals().items():
        torch.testing.assert_close(value, dense_state[name], msg=name)


def _reference_output(layer, x, top_k):
    """Mean-logit attention built the slow way: every [q_i; k_j] pair through the plain backbone, top-K by masking."""
    b, n, d = x.shape
    h, dh = layer.n_heads, layer.d_head
    q, k, v = (p(x).view(b, n, h, dh).transpose(1, 2) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    pairs = torch.cat([q.unsqueeze(3).expand(b, h, n, n, dh), k.unsqueeze(2).expand(b, h, n, n, dh)], -1)
    z = layer.motor(torch.tanh(layer.command(torch.tanh(layer.inter(pairs)))))  # (B, H, n_q, n_k, 3)
    kappa = F.softplus(z[..., 0]) + layer.kappa_min
    t = torch.sigmoid(layer.t_b - layer.t_a).view(1, h, 1, 1)
    mu = torch.tanh(z[..., 1]) * (1 - torch.exp(-kappa * t))
    keep = torch.zeros_like(mu, dtype=torch.bool).scatter_(-1, (q @ k.transpose(-1, -2)).topk(top_k, -1).indices, True)
    alpha = torch.softmax(mu.masked_fill(~keep, float("-inf")), -1)  # (B, H, n_q, n_k)
    return layer.out_proj((alpha @ v).transpose(1, 2).reshape(b, n, d))


@pytest.mark.parametrize("top_k", [1, 3, 7])
def test_top_k_matches_a_masked_dense_reference(top_k):
    layer = _layer(top_k=top_k)
    x = torch.randn(2, 9, 32)
    out = layer(x, sample=False)[0]
    torch.testing.assert_close(out, _reference_output(layer, x, top_k), atol=1e-5, rtol=1e-4)
    chosen = layer.internals()["keys"]  # (B, H, n, K), highest score first
    b, n, d = x.shape
    q, k = (p(x).view(b, n, 4, d // 4).transpose(1, 2) for p in (layer.q_proj, layer.k_proj))
    scores = q @ k.transpose(-1, -2)  # (B, H, n, n)
    picked = scores.gather(-1, chosen)
    assert chosen.shape[-1] == top_k and (picked.diff(dim=-1) <= 0).all()
    torch.testing.assert_close(picked, scores.topk(top_k, -1).values)


def test_pooled_readout_equals_pooling_the_token_outputs():
    layer = _layer(top_k=3)
    x = torch.randn(4, 6, 32)
    w, c = torch.randn(2, 64), torch.randn(2)
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


def test_loss_is_nll_plus_the_documented_regulariser():
    model = _controller(out_dim=1, n_passes=3, reg_weight=0.5)
    x, y = torch.randn(16, 6, 3), torch.randn(16, 1)
    loss = model.loss(x, y)
    parts = model.last_loss
    reg = 0.5 * math.log1p(parts["epi_id"] / (parts["epi_ood"] + 1e-3))
    assert parts["reg"] == pytest.approx(reg, rel=1e-5)
    assert loss.item() == pytest.approx(parts["nll"] + 0.5 * reg, rel=1e-5)
    assert parts["epi_id"] > 0 and parts["epi_ood"] > 0  # N >= 2 passes: the regulariser is alive
    with pytest.raises(ValueError, match="n_passes"):
        NSACConfig(n_passes=1)
    NSACConfig(n_passes=1, reg_weight=0.0)  # allowed without the regulariser


def test_tiny_overfit_lowers_the_loss_and_state_dict_round_trip():
    model = _controller(out_dim=1)
    x = torch.randn(32, 6, 3)
    y = x[:, :, 0].mean(1, keepdim=True) * 2
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    torch.manual_seed(1)
    first = model.loss(x, y).item()
    for _ in range(60):
        opt.zero_grad()
        model.loss(x, y).backward()
        opt.step()
    assert model.loss(x, y).item() < first - 0.5
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
    t = model.internals()["t"]  # (B, H, 1, 1): one time per example, shared by its tokens
    assert t.shape == (4, 2, 1, 1)
    torch.testing.assert_close(t[:, 0, 0, 0], torch.sigmoid(-x[:, 0]))
    with pytest.raises(ValueError, match="time_feature"):
        NSACConfig(encoder=EncoderConfig(kind="frames"), time_feature=0)


def test_bench_attention_runs_and_writes_its_figures(tmp_path):
    import json

    from drive.cli import main

    out = tmp_path / "bench.json"
    args = ["--tokens", "8", "32", "--batch", "2", "--repeats", "1", "--warmup", "0", "--samples", "3"]
    assert main(["bench", "attention", "--out", str(out), *args]) == 0
    result = json.loads(out.read_text())
    assert [r["n"] for r in result["attention"]] == [8, 32]
    for row in result["attention"]:
        assert row["nsac_cpu_ms"] > 0 and row["nsac_peak_mib"] > 0 and row["sdpa_block_peak_mib"] > 0
    assert result["sampling"][0]["pooled_ratio"] > 0 and "profile_memory" in result["method"]["memory"]
