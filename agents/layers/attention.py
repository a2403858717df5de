"""The deterministic attention block and readout every baseline shares (NSAC swaps in its own attention layer).

    tokens (B, T, d) --SelfAttention--> (B, T, d) --TokenReadout--> (B, d) --method head--> outputs

`SelfAttention` is standard pre-norm multi-head self-attention (Vaswani et al. 2017) with a residual connection,
computed by `torch.nn.functional.scaled_dot_product_attention` (looked up at call time, so inference-time
stochastic attention can intercept it without retraining). `TokenReadout` mean-pools the tokens and applies one
LayerNorm -> Linear -> GELU layer; it is the common "pooled readout" before each method's own output head.

Dropout here is part of a method (MC dropout), not of `.train()`/`.eval()`: when `dropout > 0` it is active in both
modes, and masks are drawn from the `generator` passed to `forward` so sampling is reproducible. Baselines that are
deterministic simply use `dropout = 0`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agents.encoders import EncoderConfig, build_encoder
from agents.lane_noise import LaneGenerators, lane_noise


def dropout(x: Tensor, p: float, generator: torch.Generator | None = None) -> Tensor:
    """Inverted dropout whose mask comes from `generator` (always active: the method's randomness)."""
    if p <= 0:
        return x
    if isinstance(generator, LaneGenerators):  # rows are (sample, lane) pairs, lane fastest (agents/mc_dropout.py)
        shape = (x.shape[0] // len(generator), len(generator), *x.shape[1:])
        u = lane_noise(shape, generator, 1, "uniform", x.dtype, x.device).reshape(x.shape)
    else:
        u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    keep = u >= p
    return x * keep / (1 - p)


class SelfAttention(nn.Module):
    """x + Dropout(W_o . MHA(LN(x))), multi-head attention by scaled_dot_product_attention. (B, T, d) -> (B, T, d)."""

    def __init__(self, d_model: int, n_heads: int = 4, dropout: float = 0.0):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.p = dropout
        self.norm = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.norm(x)).view(b, t, 3, self.n_heads, d // self.n_heads)  # (B, T, 3, H, dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, dh)
        heads = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, dh)
        mixed = heads.transpose(1, 2).reshape(b, t, d)  # (B, T, d)
        return x + dropout(self.out(mixed), self.p, generator)


class TokenReadout(nn.Module):
    """Mean over tokens -> LayerNorm -> Linear -> GELU (-> dropout). (B, T, d) -> (B, d)."""

    def __init__(self, d_model: int, dropout: float = 0.0):
        super().__init__()
        self.p = dropout
        self.norm = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, d_model)

    def forward(self, tokens: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return self.pooled(tokens.mean(1), generator)  # (B, T, d) -> (B, d)

    def pooled(self, pooled: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The layer on token means already pooled: (.., d) -> (.., d) (NSAC pools each sample inside its layer)."""
        return dropout(F.gelu(self.fc(self.norm(pooled))), self.p, generator)


class AttentionBackbone(nn.Module):
    """Shared encoder -> SelfAttention -> TokenReadout. Split in two so sampling methods run the encoder once."""

    def __init__(self, encoder: EncoderConfig, n_heads: int = 4, dropout: float = 0.0):
        super().__init__()
        self.encoder = build_encoder(encoder)
        self.attention = SelfAttention(encoder.d_model, n_heads, dropout)
        self.readout = TokenReadout(encoder.d_model, dropout)

    def tokens(self, x: Tensor) -> Tensor:  # input -> (B, T, d)
        return self.encoder(x)

    def head_input(self, tokens: Tensor, generator: torch.Generator | None = None) -> Tensor:  # (N, T, d) -> (N, d)
        return self.readout(self.attention(tokens, generator), generator)

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:  # input -> (B, d)
        return self.head_input(self.tokens(x), generator)


class GaussianHead(nn.Module):
    """(.., d) -> mean (.., D) and variance softplus(s) + min_var (.., D): a heteroscedastic Gaussian output."""

    def __init__(self, d_model: int, out_dim: int, min_var: float = 1e-6):
        super().__init__()
        self.fc = nn.Linear(d_model, 2 * out_dim)
        self.min_var = min_var

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        mu, raw = self.fc(h).chunk(2, dim=-1)
        return mu, F.softplus(raw) + self.min_var
