"""TimesFM: the public checkpoint's key/shape layout, the loader (round trip, one-line errors naming the key), the
causal mask and padding, and SA reaching its attention. Real weights cannot be downloaded here: a tiny randomly
initialised model of the same class stands in."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agents.layers.stochastic_attention import stochastic_attention
from agents.timesfm import (
    TIMESFM_1_0_200M,
    TIMESFM_2_0_500M,
    TimesFM,
    TimesFMCheckpointError,
    TimesFMConfig,
    load_timesfm,
)

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = TimesFMConfig(
    n_layers=2, d_model=32, d_ff=48, n_heads=4, n_kv_heads=2, head_dim=8, patch_len=8, output_patch_len=16,
    quantiles=(0.1, 0.5, 0.9), context_len=64,
)  # fmt: skip


def tiny(seed: int = 0) -> TimesFM:
    torch.manual_seed(seed)
    model = TimesFM(TINY).eval()
    with torch.no_grad():  # move norms and query scaling off their neutral init, as trained weights would be
        for name, p in model.named_parameters():
            if name.endswith(("scaling", "layernorm.weight")):
                p.add_(0.3 * torch.randn_like(p))
    return model


def series(n: int = 4, t: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, t, generator=g).cumsum(1) + 10 * torch.randn(n, 1, generator=g)


def layout(cfg: TimesFMConfig) -> dict[str, tuple[int, ...]]:
    """Every key and shape of the public torch_model.ckpt (google-research/timesfm PatchedTimeSeriesDecoder)."""
    d, f, p, dh = cfg.d_model, cfg.d_ff, cfg.patch_len, cfg.head_dim
    n_out = cfg.output_patch_len * (1 + len(cfg.quantiles))
    qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * dh
    keys = {"freq_emb.weight": (3, d)}
    for block, (d_in, d_out) in {"input_ff_layer": (2 * p, d), "horizon_ff_layer": (d, n_out)}.items():
        keys |= {f"{block}.hidden_layer.0.weight": (f, d_in), f"{block}.hidden_layer.0.bias": (f,)}
        keys |= {f"{block}.output_layer.weight": (d_out, f), f"{block}.output_layer.bias": (d_out,)}
        keys |= {f"{block}.residual_layer.weight": (d_out, d_in), f"{block}.residual_layer.bias": (d_out,)}
    for i in range(cfg.n_layers):
        layer = f"stacked_transformer.layers.{i}"
        keys |= {f"{layer}.self_attn.scaling": (dh,), f"{layer}.input_layernorm.weight": (d,)}
        keys |= {f"{layer}.self_attn.qkv_proj.weight": (qkv, d), f"{layer}.self_attn.qkv_proj.bias": (qkv,)}
        keys |= {f"{layer}.self_attn.o_proj.weight": (d, cfg.n_heads * dh), f"{layer}.self_attn.o_proj.bias": (d,)}
        keys |= {f"{layer}.mlp.gate_proj.weight": (f, d), f"{layer}.mlp.gate_proj.bias": (f,)}
        keys |= {f"{layer}.mlp.down_proj.weight": (d, f), f"{layer}.mlp.down_proj.bias": (d,)}
        keys |= {f"{layer}.mlp.layer_norm.weight": (d,), f"{layer}.mlp.layer_norm.bias": (d,)}
    return keys


@pytest.mark.parametrize(("cfg", "n_params"), [(TIMESFM_1_0_200M, 203_568_960), (TIMESFM_2_0_500M, 498_828_960)])
def test_state_dict_has_the_public_checkpoint_layout(cfg, n_params):
    with torch.device("meta"):  # shapes only, no memory
        model = TimesFM(cfg)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == layout(cfg)
    assert sum(p.numel() for p in model.parameters()) == n_params  # "200m" and "500m"


def test_forecast_shapes_and_autoregressive_horizon():
    model = tiny()
    with torch.no_grad():
        out = model(series(), torch.zeros(4, 64), torch.zeros(4, 1))
        fc = model.forecast(series(), 40)  # 3 output patches of 16
    assert out.shape == (4, 8, 16, 4)  # (B, N, P_out, 1 + Q)
    assert fc.mean.shape == (4, 40) and fc.quantiles.shape == (4, 40, 3)
    torch.testing.assert_close(fc.mean[:, :16], out[:, -1, :, 0])  # the first patch is the last token's output
    assert torch.isfinite(fc.quantiles).all()


def test_attention_is_causal_and_left_padding_changes_nothing():
    model = tiny()
    x, zeros, freq = series(), torch.zeros(4, 64), torch.zeros(4, 1)
    with torch.no_grad():
        base = model(x, zeros, freq)
        later = x.clone()
        later[:, 40:] += 5.0  # touch patches 5.. only
        changed = model(later, zeros, freq)
        padded = model(torch.cat([torch.zeros(4, 16), x], 1), torch.cat([torch.ones(4, 16), zeros], 1), freq)
    torch.testing.assert_close(changed[:, :5], base[:, :5])  # earlier tokens cannot see later patches
    assert (changed[:, 5:] - base[:, 5:]).abs().max() > 1e-2
    torch.testing.assert_close(padded[:, 2:], base, rtol=1e-4, atol=1e-3)  # masked keys, positions from first patch


def test_save_load_round_trip_gives_identical_forecasts(tmp_path):
    model = tiny(seed=3)
    path = tmp_path / "torch_model.ckpt"
    torch.save(model.state_dict(), path)
    loaded = load_timesfm(path, TINY)
    assert not loaded.training
    with torch.no_grad():
        a, b = model.forecast(series(), 24, freq=1), loaded.forecast(series(), 24, freq=1)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.quantiles, b.quantiles)


def test_safetensors_round_trip(tmp_path):
    save_file = pytest.importorskip("safetensors.torch").save_file
    model = tiny(seed=4)
    save_file(model.state_dict(), tmp_path / "model.safetensors")
    loaded = load_timesfm(tmp_path / "model.safetensors", TINY)
    with torch.no_grad():
        assert torch.equal(model.forecast(series(), 16).mean, loaded.forecast(series(), 16).mean)


def _error(tmp_path, state, cfg=TINY) -> str:
    path = tmp_path / "torch_model.ckpt"
    torch.save(state, path)
    with pytest.raises(TimesFMCheckpointError) as info:
        load_timesfm(path, cfg)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path))
    return message


def test_wrong_missing_or_misshapen_keys_get_a_one_line_error_naming_the_key(tmp_path):
    state = tiny().state_dict()
    key = "stacked_transformer.layers.1.self_attn.qkv_proj.weight"
    renamed = {("stacked_transformer.layers.1.attn.qkv.weight" if k == key else k): v for k, v in state.items()}
    message = _error(tmp_path, renamed)
    assert (
        f"missing key '{key}'" in message and "unexpected key 'stacked_transformer.layers.1.attn.qkv.weight'" in message
    )
    assert f"missing key '{key}'" in _error(tmp_path, {k: v for k, v in state.items() if k != key})
    misshapen = {**state, "freq_emb.weight": torch.zeros(3, 16)}
    assert "key 'freq_emb.weight' has shape (3, 16), expected (3, 32)" in _error(tmp_path, misshapen)
    three = TimesFM(dataclasses.replace(TINY, n_layers=3)).state_dict()
    assert "the file has 3 transformer layers, the config 2" in _error(tmp_path, three)


def test_unreadable_files_get_a_one_line_error(tmp_path):
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(TimesFMCheckpointError, match="garbage.ckpt: not a readable weight file") as info:
        load_timesfm(garbage, TINY)
    assert "\n" not in str(info.value)
    truncated = tmp_path / "truncated.ckpt"
    torch.save(tiny().state_dict(), truncated)
    truncated.write_bytes(truncated.read_bytes()[:300])
    with pytest.raises(TimesFMCheckpointError, match="truncated.ckpt: not a readable weight file"):
        load_timesfm(truncated, TINY)
    with pytest.raises(TimesFMCheckpointError, match="missing.ckpt: not a readable weight file"):
        load_timesfm(tmp_path / "missing.ckpt", TINY)
    assert "not a state_dict of tensors" in _error(tmp_path, {"weights": [1, 2, 3]})


def test_sa_reaches_every_layer_is_mean_preserving_and_switches_off():
    model = tiny(seed=1)
    x, m = series(n=3), 4000
    with torch.no_grad():
        det = model.forecast(x, 16).mean  # (B, H)
        with stochastic_attention(model, 64, torch.Generator().manual_seed(0)):
            draws = model.forecast(x.repeat(m, 1), 16).mean.view(m, *det.shape)  # (M, B, H): M passes
        after = model.forecast(x, 16).mean
    spread = (draws - det).abs().mean()
    assert spread > 5e-4 * det.abs().mean()  # SA changes the output
    bias = (draws.mean(0) - det).abs().mean()
    assert bias < 0.1 * spread  # the average of many passes is the deterministic forecast
    assert torch.equal(after, det)  # off again, bit for bit
