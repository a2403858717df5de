"""PatchTST: a small patch-transformer forecaster, the SA study's stand-in for a time-series foundation model.

Nie, Nguyen, Sinthong & Kalagnanam, "A Time Series is Worth 64 Words: Long-term Forecasting with Transformers",
ICLR 2023, with reversible instance normalisation (RevIN; Kim et al., ICLR 2022). The SA paper (Yadav, Adebiyi &
Zhang 2026) fine-tunes TimesFM on ETTh1/ETTh2/ETTm1/ETTm2 at horizons 96 and 192 and reports MAE, the native 95 %
coverage of SA's samples and interval width at matched coverage. TimesFM's weights cannot be fetched here
(`agents/timesfm.py` loads them where they exist), so this model, trained from scratch in minutes on 2 CPU cores,
is the attention model SA acts on:

    x (B, L, C) -> series (B, L, c)            c = 1: the target channel alone; c = C: every channel
    RevIN:   z = (series - m) / s              m, s: mean and std of each window and channel over the L steps
    patches: z -> (B, N, d)                    P = 16, stride 8, N = (L - 16) // 8 + 2 (encoder kind "patches")
    n_layers x pre-norm layer: h + Drop(W_o MHA(LN h)),  h + Drop(MLP(LN h))    MHA by scaled_dot_product_attention
    head:    LN, flatten (B, N d) -> Linear -> mu_z, softplus(s_z) + 1e-6 per horizon step, (B, H) each
    mean = m_t + s_t mu_z,  var = s_t^2 sigma_z^2    (t: the target channel), in the units of x[..., target]

Contract: y is the continuation of x[..., target] in the same units (windows cut from one standardised array), so
RevIN can hand the level and scale of the window back to the forecast.

Choices and departures:
- Channel independence by default (encoder.in_dim = 1, only x[..., target] is read): the target's forecast uses its
  own history, as in PatchTST's channel-independent setting (which Nie et al. found better than channel mixing on
  these benchmarks) and as in TimesFM, a univariate model. encoder.in_dim = C instead mixes all channels in each
  patch token (covariates inform the target).
- Output: a heteroscedastic Gaussian per horizon step, not a point: every controller answers (mu, var) and the
  trainer early-stops on validation NLL. The mean is what SA perturbs and what MAE scores, so it is trained like
  TimesFM's MSE-trained mean head: beta-NLL (Seitzer et al., ICLR 2022), the per-element NLL weighted by
  stopgrad(var)^beta; beta = 1 gives the mean exactly the MSE gradient while the variance is still fitted by NLL
  (the logged training loss is then the weighted NLL, not an NLL; beta = 0 is the plain NLL of GMLE).
  SA's predictive in the study is the empirical distribution of the M sampled means: read native coverage and width
  from `moments(x, M)[0]` with SA on; the variance head is the model's own interval for comparison.
- Samples: the model is deterministic. `moments(x, S)` runs S passes (folded into the batch) only while SA is
  enabled on this controller or a submodule of it; SA then draws independently per head, query row and pass. The
  `generator` argument is unused: SA's draws come from the generator given to `enable_stochastic_attention`.
- Pre-norm LayerNorm instead of PatchTST's post-norm BatchNorm: trains without warm-up in a few epochs and is the
  norm of this project's attention block (and TimesFM's). RevIN without its learnable affine (PatchTST's default).
- Dropout is regularisation, active in training mode only (residual branches; attention weights via SDPA's
  dropout_p) and off in eval, so the attention weights at inference are exactly the softmax SA resamples.
- Defaults: look-back L = 336 and patches 16/8 as PatchTST's ETT runs; 3 layers, 4 heads, d_ff = 128 as its small
  ETTh configuration, width 32 (PatchTST used 16 on ETTh, 128 on ETTm); H = out_dim = 96 (or 192).
- With a non-window encoder (features, sequence: the registry's contract tests) there is no series to normalise:
  no RevIN, and the tokens are mean-pooled rather than flattened (their count is not fixed by the config).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agents.base import Controller
from agents.checks import at_least, heads_divide, in_range
from agents.encoders import EncoderConfig, build_encoder
from agents.layers.stochastic_attention import is_stochastic


@dataclass(frozen=True)
class PatchTSTConfig:
    encoder: EncoderConfig = EncoderConfig(kind="patches", in_dim=1, n_tokens=336, d_model=32)
    """patch encoder: in_dim 1 reads the target channel alone (channel-independent), C mixes all channels; n_tokens
    is the look-back length L"""
    out_dim: int = 96
    """forecast horizon H (steps of the target channel)"""
    n_layers: int = 3
    """transformer layers"""
    n_heads: int = 4
    """attention heads"""
    d_ff: int = 128
    """hidden width of each layer's MLP"""
    dropout: float = 0.2
    """dropout on residual branches, training mode only"""
    attn_dropout: float = 0.0
    """dropout on attention weights, training mode only (never at inference, where SA acts)"""
    target: int = -1
    """index of the target channel in the window's last axis"""
    beta: float = 1.0
    """beta-NLL exponent: 1 trains the mean as MSE does, 0 is the plain Gaussian NLL"""

    def __post_init__(self) -> None:
        heads_divide(self, self.encoder.d_model)
        at_least(self, 1, "out_dim", "n_layers", "d_ff")
        in_range(self, "dropout", 0, 1, high_open=True)
        in_range(self, "attn_dropout", 0, 1, high_open=True)
        in_range(self, "beta", 0, 1)
        if self.encoder.in_dim > 1:  # the target indexes the channels the encoder reads
            in_range(self, "target", -self.encoder.in_dim, self.encoder.in_dim, high_open=True)

    def build(self) -> PatchTST:
        return PatchTST(self)


class EncoderLayer(nn.Module):
    """Pre-norm transformer layer, attention by scaled_dot_product_attention. (B, T, d) -> (B, T, d)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attn_dropout: float):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads, self.p, self.p_attn = n_heads, dropout, attn_dropout
        self.norm_attn = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm_mlp = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.norm_attn(x)).view(b, t, 3, self.n_heads, d // self.n_heads)  # (B, T, 3, h, dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, h, T, dh)
        heads = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p_attn if self.training else 0.0)
        mixed = heads.transpose(1, 2).reshape(b, t, d)  # (B, h, T, dh) -> (B, T, d)
        x = x + F.dropout(self.out(mixed), self.p, self.training)
        return x + F.dropout(self.mlp(self.norm_mlp(x)), self.p, self.training)


class PatchTST(Controller):
    default_samples = 1

    def __init__(self, cfg: PatchTSTConfig):
        super().__init__(cfg.out_dim)
        self.cfg = cfg
        self.windowed = cfg.encoder.kind == "patches"
        d = cfg.encoder.d_model
        self.encoder = build_encoder(cfg.encoder)
        self.layers = nn.Sequential(
            *(EncoderLayer(d, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attn_dropout) for _ in range(cfg.n_layers))
        )
        self.norm = nn.LayerNorm(d)
        head_in = self.encoder.n_patches * d if self.windowed else d
        self.head = nn.Linear(head_in, 2 * cfg.out_dim)

    def _series(self, x: Tensor) -> tuple[Tensor, int]:
        """The channels the encoder reads, (B, L, c), and the target's index among them."""
        c_in, c = self.cfg.encoder.in_dim, x.shape[-1]
        if c == c_in:
            return x, (self.cfg.target % c if c > 1 else 0)
        if c_in == 1:
            return x[..., [self.cfg.target]], 0  # (B, L, 1)
        raise ValueError(f"window has {c} channels; the encoder reads in_dim={c_in} (1 = the target channel alone)")

    def _gaussian(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and variance per horizon step in the controller's standardised target units, (B, H) each."""
        if not self.windowed:
            h = self.norm(self.layers(self.encoder(x))).mean(1)  # (B, T, d) -> (B, d)
            mu, raw = self.head(h).chunk(2, -1)
            return mu, F.softplus(raw) + 1e-6
        series, t = self._series(x)
        loc = series.mean(1, keepdim=True)  # (B, 1, c)
        scale = (series.var(1, unbiased=False, keepdim=True) + 1e-5).sqrt()  # (B, 1, c), RevIN's eps
        h = self.norm(self.layers(self.encoder((series - loc) / scale)))  # (B, N, d)
        mu_z, raw = self.head(h.flatten(1)).chunk(2, -1)  # (B, N*d) -> (B, H) each
        m, s = loc[:, :, t], scale[:, :, t]  # (B, 1): the target's level and scale, in the units of y
        return self._standardise(m + s * mu_z), (s / self.y_scale) ** 2 * (F.softplus(raw) + 1e-6)

    def _moments(self, x: Tensor, samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        if samples > 1 and any(is_stochastic(m) for m in self.modules()):
            mu, var = self._gaussian(x.repeat(samples, *([1] * (x.dim() - 1))))  # (S*B, H): S passes
            return mu.view(samples, -1, self.out_dim), var.view(samples, -1, self.out_dim)  # (S, B, H)
        mu, var = self._gaussian(x)  # deterministic: one pass stands for every sample
        return mu.expand(samples, *mu.shape), var.expand(samples, *var.shape)  # (S, B, H)

    def _loss(self, x: Tensor, y: Tensor) -> Tensor:
        mu, var = self._gaussian(x)
        nll = 0.5 * (torch.log(2 * math.pi * var) + (y - mu) ** 2 / var)  # (B, H)
        if self.cfg.beta:
            nll = nll * var.detach() ** self.cfg.beta
        return nll.mean()
