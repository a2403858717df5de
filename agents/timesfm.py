"""TimesFM: the patched-decoder time-series foundation model, in a form whose state_dict is the public checkpoint's.

Das, Kong, Sen & Zhou, "A decoder-only foundation model for time-series forecasting", ICML 2024; the model the SA
paper (Yadav, Adebiyi & Zhang 2026) calibrates on ETT. The architecture and every parameter name and shape follow
the public PyTorch port (google-research/timesfm, `pytorch_patched_decoder.py`, read for facts, not copied):

    context (B, T), padding (B, T) (1 = missing), T a multiple of P = 32
    patches (B, N, P); mu, sigma = mean, std of the first patch with >= 3 observed values (per series)
    input_ff_layer:   [ (x - mu) / sigma * (1 - pad), pad ] (B, N, 2P) -> residual block -> (B, N, d)
                      + sinusoidal position of each patch counted from the first observed one (1.0 only)
                      + freq_emb(freq) (3 frequency classes: 0 high, 1 medium, 2 low)
    stacked_transformer: n_layers x [ h + o_proj(causal MHA(RMSNorm h)),  h + (1 - pad) down(relu(gate(LN h))) ]
                      queries scaled per dimension by softplus(scaling) * 1.442695 / sqrt(head_dim)
    horizon_ff_layer: (B, N, d) -> residual block -> (B, N, 128, 1 + Q) * sigma + mu   [mean, q0.1, ..., q0.9]
A residual block is Linear -> SiLU -> Linear plus a linear skip. The forecast is read from the last patch's output;
horizons beyond 128 are decoded autoregressively, feeding the mean back (`forecast`, as the reference decode).

Weights: the Hugging Face repositories google/timesfm-1.0-200m-pytorch and google/timesfm-2.0-500m-pytorch, file
`torch_model.ckpt` (a plain state_dict, as the reference loads it; about 0.8 GB and 2 GB in float32), e.g.
`huggingface-cli download google/timesfm-1.0-200m-pytorch torch_model.ckpt --local-dir DIR`, then
`load_timesfm("DIR/torch_model.ckpt", TIMESFM_1_0_200M)`. A `.safetensors` file with the same key names also loads
(needs the `safetensors` package). Files of other ports (e.g. the Hugging Face `transformers` TimesFM) use other key
names and are refused with the first mismatching key named; TimesFM 2.5 is a different architecture.

Use: `forecast(context, H)` -> Forecast(mean, quantiles); the reference API's default point forecast is the 0.5
quantile head, its autoregressive feedback the mean head. SA: `with stochastic_attention(model, nu, g):
model.forecast(context.repeat(M, 1), H)` gives M passes; beyond 128 steps each pass feeds back its own sampled mean,
so a pass is one coherent trajectory. Fine-tuning (as the SA paper does) needs a loss and a trainer; not here.

Verified here: keys, shapes and parameter counts against the reference layout (on a meta-device 1.0-200m and
2.0-500m: 203.6 M and 498.8 M parameters); on a tiny model with random weights, forward and autoregressive decode
agree with the reference module given the same state_dict to float32 rounding (a one-off check against the
reference file from the timesfm 1.3.0 package, not part of the suite, which does not depend on it); save -> load
round trip. Not verified (no download possible): loading the real files and their forecasts.

Departures, none of which changes the function of loaded weights:
- attention is `F.scaled_dot_product_attention` (scale 1 on the pre-scaled query, the reference's additive mask of
  -0.7 x float max, so a fully padded query row is uniform, never NaN), so SA reaches every layer;
- fresh parameters are initialised usably (RMSNorm weight 1, `scaling` 0, i.e. the plain 1/sqrt(head_dim)); the
  reference leaves them zero/uninitialised because they are always loaded;
- padding is given by the mask only (the reference also treats the value 1123581321.0 as padding).
"""

from __future__ import annotations

import math
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class TimesFMConfig:
    n_layers: int = 20
    """transformer layers (1.0-200m: 20, 2.0-500m: 50)"""
    d_model: int = 1280
    """model width (hidden_size)"""
    d_ff: int = 1280
    """hidden width of the MLPs and residual blocks (intermediate_size)"""
    n_heads: int = 16
    """query heads"""
    n_kv_heads: int = 16
    """key/value heads (grouped-query attention when fewer than n_heads)"""
    head_dim: int = 80
    """width of one head"""
    patch_len: int = 32
    """input patch length"""
    output_patch_len: int = 128
    """steps forecast from one token (horizon_len in the reference)"""
    quantiles: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    """quantile heads after the mean head"""
    context_len: int = 512
    """context the checkpoint was trained with; `forecast` pads or trims the context to it (1.0: 512, 2.0: 2048)"""
    positional_embedding: bool = True
    """add sinusoidal patch positions (1.0: yes, 2.0: no)"""
    rms_eps: float = 1e-6
    """RMSNorm epsilon"""
    tolerance: float = 1e-6
    """a context std below this is replaced by 1"""


TIMESFM_1_0_200M = TimesFMConfig()
TIMESFM_2_0_500M = TimesFMConfig(n_layers=50, context_len=2048, positional_embedding=False)


class Forecast(NamedTuple):
    mean: Tensor  # (B, H) the mean head
    quantiles: Tensor  # (B, H, Q) the quantile heads (the reference API's default point forecast is the 0.5 one)


class TimesFMCheckpointError(ValueError):
    """A TimesFM weight file is unreadable or does not match the configuration (the message names the key)."""


class ResidualBlock(nn.Module):
    def __init__(self, d_in: int, d_hidden: int, d_out: int):
        super().__init__()
        self.hidden_layer = nn.Sequential(nn.Linear(d_in, d_hidden), nn.SiLU())
        self.output_layer = nn.Linear(d_hidden, d_out)
        self.residual_layer = nn.Linear(d_in, d_out)

    def forward(self, x: Tensor) -> Tensor:
        return self.output_layer(self.hidden_layer(x)) + self.residual_layer(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: TimesFMConfig):
        super().__init__()
        if cfg.n_heads % cfg.n_kv_heads:
            raise ValueError(f"n_heads={cfg.n_heads} must be a multiple of n_kv_heads={cfg.n_kv_heads}")
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.scaling = nn.Parameter(torch.zeros(cfg.head_dim))
        self.qkv_proj = nn.Linear(cfg.d_model, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:  # (B, N, d), additive mask (B, 1, N, N) -> (B, N, d)
        b, n, _ = x.shape
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(x).split([q_size, kv_size, kv_size], -1)
        q = q.view(b, n, self.n_heads, self.head_dim).transpose(1, 2)  # (B, h, N, dh)
        k = k.view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, h_kv, N, dh)
        v = v.view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = q * (F.softplus(self.scaling) * (1.442695041 / math.sqrt(self.head_dim)))  # 1.4427 = 1 / softplus(0)
        gqa = self.n_kv_heads != self.n_heads
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0, enable_gqa=gqa)  # (B, h, N, dh)
        return self.o_proj(heads.transpose(1, 2).reshape(b, n, q_size))


class MLP(nn.Module):
    def __init__(self, cfg: TimesFMConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model)
        self.layer_norm = nn.LayerNorm(cfg.d_model, eps=1e-6)

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:  # (B, N, d), patch padding (B, N)
        return x + self.down_proj(F.relu(self.gate_proj(self.layer_norm(x)))) * (1.0 - pad[..., None])


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TimesFMConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.rms_eps)

    def forward(self, x: Tensor, mask: Tensor, pad: Tensor) -> Tensor:
        return self.mlp(x + self.self_attn(self.input_layernorm(x), mask), pad)


class StackedDecoder(nn.Module):
    def __init__(self, cfg: TimesFMConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:  # (B, N, d), patch padding (B, N)
        n = x.shape[1]
        future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)  # key after query
        blocked = (pad[:, :, None] > 0) | (pad[:, None, :] > 0) | future  # (B, N, N): padded query or key
        mask = blocked[:, None].to(x.dtype) * (-0.7 * torch.finfo(x.dtype).max)  # (B, 1, N, N)
        for layer in self.layers:
            x = layer(x, mask, pad)
        return x


def _context_stats(patches: Tensor, pad: Tensor, tolerance: float) -> tuple[Tensor, Tensor]:
    """Mean and std (B,) of each series' first patch with >= 3 observed values (the last patch if none has)."""
    observed = 1.0 - pad  # (B, N, P)
    enough = observed.sum(-1) >= 3  # (B, N)
    first = torch.where(enough.any(1), enough.int().argmax(1), enough.shape[1] - 1)  # (B,)
    rows = torch.arange(patches.shape[0], device=patches.device)
    values, keep = patches[rows, first] * observed[rows, first], observed[rows, first]  # (B, P) each
    count = keep.sum(-1).clamp_min(1.0)
    mean = values.sum(-1) / count
    std = (values.pow(2).sum(-1) / count - mean**2).clamp_min(0.0).sqrt()
    return mean, torch.where(std < tolerance, torch.ones_like(std), std)


def _positions(pad: Tensor, d_model: int) -> Tensor:
    """Sinusoidal embedding (B, N, d) of patch positions counted from each series' first observed patch."""
    n = pad.shape[1]
    observed = pad == 0  # (B, N)
    first = torch.where(observed.any(1), observed.int().argmax(1), -1)  # (B,)
    pos = (torch.arange(n, device=pad.device) - first[:, None]) % n  # (B, N)
    n_scales = d_model // 2
    rates = torch.exp(torch.arange(n_scales, device=pad.device) * -(math.log(1e4) / max(n_scales - 1, 1)))
    angles = pos[..., None].float() * rates  # (B, N, d/2)
    return F.pad(torch.cat([angles.sin(), angles.cos()], -1), (0, d_model % 2))  # (B, N, d)


class TimesFM(nn.Module):
    """The patched decoder: forward gives every patch's output; `forecast` decodes a horizon from a context."""

    def __init__(self, cfg: TimesFMConfig = TIMESFM_1_0_200M):
        super().__init__()
        if cfg.context_len % cfg.patch_len:
            raise ValueError(f"context_len={cfg.context_len} must be a multiple of patch_len={cfg.patch_len}")
        self.cfg = cfg
        n_out = cfg.output_patch_len * (1 + len(cfg.quantiles))
        self.input_ff_layer = ResidualBlock(2 * cfg.patch_len, cfg.d_ff, cfg.d_model)
        self.freq_emb = nn.Embedding(3, cfg.d_model)
        self.horizon_ff_layer = ResidualBlock(cfg.d_model, cfg.d_ff, n_out)
        self.stacked_transformer = StackedDecoder(cfg)

    def forward(self, context: Tensor, padding: Tensor, freq: Tensor) -> Tensor:
        """context, padding (B, T), T a multiple of patch_len; freq (B, 1) -> (B, N, output_patch_len, 1 + Q)."""
        cfg, b = self.cfg, context.shape[0]
        patches = context.view(b, -1, cfg.patch_len)  # (B, N, P)
        pad = padding.to(context.dtype).view(b, -1, cfg.patch_len)  # (B, N, P)
        patches = torch.where(pad > 0, torch.zeros_like(patches), patches)
        mean, std = _context_stats(patches, pad, cfg.tolerance)  # (B,) each
        normed = (patches - mean[:, None, None]) / std[:, None, None] * (1.0 - pad)
        h = self.input_ff_layer(torch.cat([normed, pad], -1))  # (B, N, 2P) -> (B, N, d)
        patch_pad = pad.min(-1).values  # (B, N): padded only if every step is
        if cfg.positional_embedding:
            h = h + _positions(patch_pad, cfg.d_model).to(h.dtype)
        h = self.stacked_transformer(h + self.freq_emb(freq.long().view(b, 1)), patch_pad)  # (B, N, d)
        out = self.horizon_ff_layer(h).view(b, h.shape[1], cfg.output_patch_len, 1 + len(cfg.quantiles))
        return out * std[:, None, None, None] + mean[:, None, None, None]  # (B, N, P_out, 1 + Q)

    def forecast(
        self, context: Tensor, horizon: int, padding: Tensor | None = None, freq: int | Tensor = 0
    ) -> Forecast:
        """context (B, T) -> the next `horizon` steps; left-padded or trimmed to context_len as the reference API."""
        cfg, b = self.cfg, context.shape[0]
        padding = torch.zeros_like(context) if padding is None else padding.to(context.dtype)
        missing = cfg.context_len - context.shape[1]
        if missing > 0:
            context = F.pad(context, (missing, 0))
            padding = F.pad(padding, (missing, 0), value=1.0)
        context, padding = context[:, -cfg.context_len :], padding[:, -cfg.context_len :]  # (B, context_len)
        freq = torch.as_tensor(freq, device=context.device).long().reshape(-1).expand(b).reshape(b, 1)
        steps = []
        for _ in range(-(-horizon // cfg.output_patch_len)):
            out = self(context[:, -cfg.context_len :], padding[:, -cfg.context_len :], freq)[:, -1]  # (B, P_out, 1+Q)
            steps.append(out)
            context = torch.cat([context, out[..., 0]], 1)  # the mean is fed back
            padding = F.pad(padding, (0, cfg.output_patch_len))
        out = torch.cat(steps, 1)[:, :horizon]  # (B, H, 1 + Q)
        return Forecast(out[..., 0], out[..., 1:])


def load_timesfm(path: str | Path, cfg: TimesFMConfig = TIMESFM_1_0_200M, map_location: str = "cpu") -> TimesFM:
    """TimesFM with the weights of `path` (torch_model.ckpt via torch.load(weights_only=True), or .safetensors)."""
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path), device=map_location)
        else:
            state = torch.load(path, map_location=map_location, weights_only=True)
    except ImportError as exc:
        raise TimesFMCheckpointError(f"{path}: reading .safetensors needs the safetensors package") from exc
    except Exception as exc:  # any unreadable file (truncated, not a pickle, ...) gets the same one-line answer
        # torch's weights_only refusal is a page of advice; what matters is that the file is no plain tensor pickle
        unpickle = isinstance(exc, pickle.UnpicklingError)
        reason = "not a torch.save file of tensors" if unpickle else (str(exc).strip().splitlines() or [""])[0]
        raise TimesFMCheckpointError(f"{path}: not a readable weight file ({type(exc).__name__}: {reason})") from exc
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise TimesFMCheckpointError(f"{path}: not a state_dict of tensors (got {type(state).__name__})")
    model = TimesFM(cfg)
    check_state_dict(model, state, str(path))
    model.load_state_dict(state)
    return model.eval()


def check_state_dict(model: TimesFM, state: dict[str, Tensor], source: str = "state_dict") -> None:
    """Raise a one-line TimesFMCheckpointError naming the first missing, unexpected or wrongly shaped key."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    problems = []
    for keys, what in ((missing, "missing key"), (unexpected, "unexpected key")):
        if keys:
            problems.append(f"{what} {keys[0]!r}" + (f" (+{len(keys) - 1} more)" if len(keys) > 1 else ""))
    if wrong and not problems:
        k = wrong[0]
        problems.append(f"key {k!r} has shape {tuple(state[k].shape)}, expected {tuple(expected[k].shape)}")
    if not problems:
        return
    layers = {int(m.group(1)) for k in state if (m := re.match(r"stacked_transformer\.layers\.(\d+)\.", k))}
    hint = ""
    if layers and max(layers) + 1 != model.cfg.n_layers:
        hint = f" (the file has {max(layers) + 1} transformer layers, the config {model.cfg.n_layers})"
    raise TimesFMCheckpointError(f"{source}: {'; '.join(problems)}{hint}")
