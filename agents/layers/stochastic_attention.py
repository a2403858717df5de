"""SA: inference-time stochastic attention for any trained attention model, no retraining.

Yadav, Adebiyi & Zhang, "Calibrating Scientific Foundation Models with Inference-Time Stochastic Attention" (2026).
For each query, after the (masked) softmax pi, the output pi^T V is replaced by the normalised multinomial average

    (c / nu)^T V,   c ~ Multinomial(nu, pi)
    E[c / nu] = pi                          mean-preserving: the average of many draws is the deterministic output
    Cov[c / nu] = (diag(pi) - pi pi^T) / nu dispersion proportional to 1 / nu; nu -> infinity gives back pi

One call turns it on, one turns it off (`enable_stochastic_attention(model, nu)`, `disable_stochastic_attention`);
`stochastic_attention(model, nu)` is the same as a context manager. What it reaches:
- modules that call `torch.nn.functional.scaled_dot_product_attention` in their own forward (our
  `agents.layers.attention.SelfAttention`, most modern code): while the model runs, a TorchFunctionMode answers each
  SDPA call with an explicit masked softmax, the resampling, and the value product (`stochastic_sdpa`);
- `nn.MultiheadAttention`, hence `nn.TransformerEncoder`/`DecoderLayer`: the instance's forward is wrapped; it runs
  the stock module for the softmax weights, recomputes the value projection and mixes with resampled weights. The
  mode also switches PyTorch's fused fast paths off (they check for an active torch-function mode), which would
  otherwise skip Python and the wrapper;
- modules with an `sa_resample` attribute (our NSAC attention) get the resampler set directly.
Disabling removes every hook, wrapper and resampler: the model is the stock model again, bit for bit.
SA is an inference-time method: use the model in eval mode (dropout on attention weights is not resampled).
Not supported: MultiheadAttention with bias_k/bias_v or add_zero_attn (an error says so), scripted/compiled modules.

Sampling: nu <= 2 n draws with torch.multinomial (cost M nu); larger nu by the conditional-binomial chain
c_j ~ Bin(nu - sum_{i<j} c_i, pi_j / sum_{i>=j} pi_i) (cost M n). Both are exact. Rows without probability mass
(fully masked queries) pass through unchanged.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode


def multinomial_average(probs: Tensor, nu: int, generator: torch.Generator | None = None) -> Tensor:
    """c / nu with c ~ Multinomial(nu, probs) along the last axis, independently for every other index."""
    nu = int(nu)
    if nu < 1:
        raise ValueError(f"nu must be a positive integer, got {nu}")
    shape, n = probs.shape, probs.shape[-1]
    p = probs.reshape(-1, n)
    mass = p.sum(-1, keepdim=True)
    valid = mass > 0  # False for all-zero and NaN rows
    p = torch.where(valid, p / mass.clamp_min(1e-30), torch.full_like(p, 1.0 / n)).float()
    if nu <= 2 * n:
        draws = torch.multinomial(p, nu, replacement=True, generator=generator)  # (M, nu)
        counts = torch.zeros_like(p).scatter_add_(1, draws, torch.ones_like(draws, dtype=p.dtype))
    else:
        tail = p.flip(-1).cumsum(-1).flip(-1)  # sum_{i >= j} p_i
        cond = (p / tail.clamp_min(1e-30)).clamp(0, 1)
        left = torch.full_like(p[:, 0], float(nu))
        cols = []
        for j in range(n - 1):
            c = torch.binomial(left, cond[:, j], generator=generator)
            cols.append(c)
            left = left - c
        counts = torch.stack([*cols, left], -1)
    out = (counts / nu).to(probs.dtype)
    return torch.where(valid, out, probs.reshape(-1, n)).reshape(shape)


def stochastic_sdpa(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    nu: int,
    generator: torch.Generator | None = None,
) -> Tensor:
    """F.scaled_dot_product_attention with the softmax weights replaced by c / nu. (.., L, E) -> (.., L, Ev)."""
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(rep, -3), value.repeat_interleave(rep, -3)
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = query @ key.transpose(-2, -1) * scale  # (.., L, S)
    if is_causal:
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    weights = multinomial_average(torch.softmax(scores, -1), nu, generator)
    if dropout_p > 0:
        weights = F.dropout(weights, dropout_p)
    return weights @ value


@dataclass
class _SAState:
    nu: int
    generator: torch.Generator | None
    depth: int = 0
    handles: list[Any] = field(default_factory=list)
    wrapped: list[nn.Module] = field(default_factory=list)
    resampled: list[nn.Module] = field(default_factory=list)

    def resample(self, probs: Tensor) -> Tensor:
        return multinomial_average(probs, self.nu, self.generator)


class _SAMode(TorchFunctionMode):
    """Answers F.scaled_dot_product_attention with `stochastic_sdpa`; passes everything else through."""

    def __init__(self, state: _SAState):
        super().__init__()
        self.state = state

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return stochastic_sdpa(*args, **kwargs, nu=self.state.nu, generator=self.state.generator)
        return func(*args, **kwargs)


def _mha_forward(
    self: nn.MultiheadAttention,
    state: _SAState,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_padding_mask: Tensor | None = None,
    need_weights: bool = True,
    attn_mask: Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """nn.MultiheadAttention.forward with the attention weights resampled (installed on the instance)."""
    if self.bias_k is not None or self.add_zero_attn:
        raise NotImplementedError("stochastic attention does not support MultiheadAttention with bias_k/add_zero_attn")
    _, pi = type(self).forward(
        self,
        query,
        key,
        value,
        key_padding_mask=key_padding_mask,
        need_weights=True,
        attn_mask=attn_mask,
        average_attn_weights=False,
        is_causal=is_causal,
    )
    batched = query.dim() == 3
    v_in = value if batched else value.unsqueeze(1 - int(self.batch_first))
    v_in = v_in if self.batch_first else v_in.transpose(0, 1)  # (B, S, Ev)
    pi = pi if batched else pi.unsqueeze(0)  # (B, H, L, S)
    e, h = self.embed_dim, self.num_heads
    w_v = self.in_proj_weight[2 * e :] if self._qkv_same_embed_dim else self.v_proj_weight
    b_v = None if self.in_proj_bias is None else self.in_proj_bias[2 * e :]
    v = F.linear(v_in, w_v, b_v).view(v_in.shape[0], v_in.shape[1], h, e // h).transpose(1, 2)  # (B, H, S, dh)
    weights = state.resample(pi)  # (B, H, L, S)
    mixed = (weights @ v).transpose(1, 2).reshape(v.shape[0], -1, e)  # (B, L, E)
    out = self.out_proj(mixed)
    out = out if self.batch_first else out.transpose(0, 1)
    out = out if batched else out.squeeze(1 - int(self.batch_first))
    if not need_weights:
        return out, None
    weights = weights.mean(1) if average_attn_weights else weights
    return out, weights if batched else weights.squeeze(0)


def enable_stochastic_attention(model: nn.Module, nu: int, generator: torch.Generator | None = None) -> nn.Module:
    """Turn SA on for every attention in `model` with concentration nu (calling again just changes nu/generator)."""
    nu = int(nu)
    if nu < 1:
        raise ValueError(f"nu must be a positive integer, got {nu}")
    state: _SAState | None = getattr(model, "_sa_state", None)
    if state is not None:
        state.nu, state.generator = nu, generator
        return model
    state = _SAState(nu, generator)
    mode = _SAMode(state)

    def enter(module, args):
        if state.depth == 0:
            mode.__enter__()
        state.depth += 1

    def leave(module, args, output):
        state.depth -= 1
        if state.depth == 0:
            mode.__exit__(None, None, None)

    for module in model.modules():
        state.handles.append(module.register_forward_pre_hook(enter))
        state.handles.append(module.register_forward_hook(leave, always_call=True))
        if isinstance(module, nn.MultiheadAttention):
            module.forward = functools.partial(_mha_forward, module, state)
            state.wrapped.append(module)
        if hasattr(module, "sa_resample"):
            module.sa_resample = state.resample
            state.resampled.append(module)
    model._sa_state = state
    return model


def disable_stochastic_attention(model: nn.Module) -> nn.Module:
    """Undo `enable_stochastic_attention`: the stock, deterministic model again (no-op when SA is off)."""
    state: _SAState | None = model.__dict__.pop("_sa_state", None)
    if state is None:
        return model
    for handle in state.handles:
        handle.remove()
    for module in state.wrapped:
        del module.forward
    for module in state.resampled:
        module.sa_resample = None
    return model


def is_stochastic(model: nn.Module) -> bool:
    return getattr(model, "_sa_state", None) is not None


@contextmanager
def stochastic_attention(model: nn.Module, nu: int, generator: torch.Generator | None = None) -> Iterator[nn.Module]:
    """`with stochastic_attention(model, nu): ...` — SA on inside the block, off after it (also on error)."""
    was_on = is_stochastic(model)
    old = (model._sa_state.nu, model._sa_state.generator) if was_on else None
    enable_stochastic_attention(model, nu, generator)
    try:
        yield model
    finally:
        if old is None:
            disable_stochastic_attention(model)
        else:
            enable_stochastic_attention(model, *old)
