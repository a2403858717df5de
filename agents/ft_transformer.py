"""FT-Transformer: the backbone of the SA study's UCI experiments, and its plain deterministic controller.

Gorishniy, Rubachev, Khrulkov & Babenko, "Revisiting Deep Learning Models for Tabular Data", NeurIPS 2021 (sec. 3.3,
their default configuration for 3 blocks, and their `rtdl` code where the text is silent):

    tokens   T_j = x_j W_j + b_j  (encoder kind `ft_features`),  T = stack[T_1 .. T_F, CLS]       (B, F + 1, d)
    block    T <- T + MHSA(LN(T));  T <- T + W_2 ReGLU(W_1 LN(T))   (pre-norm; no LN before the first MHSA)
    ReGLU    ReGLU(u) = a * relu(g),  [a, g] = u,  hidden width d * 4/3
    readout  y_hat = Linear(ReLU(LN(T_CLS)))
    defaults d = 192, 8 heads, attention dropout 0.2 (on the softmax weights), FFN dropout 0.1 (on the ReGLU hidden),
             residual dropout 0; AdamW without weight decay on the tokenizer, LayerNorms and biases (their optimizer).
As in their code, the CLS token is appended last and the last block computes only the CLS query (the other rows
never reach the readout).

Output: a point prediction trained by the mean squared error (their regression loss). The SA paper is explicit
enough to decide it: SA's predictive distribution is the empirical distribution of the stochastic passes (PIT "from
the empirical predictive CDF"), and L_SA matches the pass spread to the whole residual ||y - f(x)||, which would
double-count a predicted noise variance. So `moments` returns the sample predictions with var = 0 (the spread
between samples is the whole predictive; a single deterministic model has none, which is what SA adds post hoc).
The MSE is the Gaussian NLL with fixed variance 1/2 in standardised units, constants dropped: the likelihood the
weight-space baselines (IVON, contextual dropout) build on.

Attention runs through `F.scaled_dot_product_attention` whenever no dropout is drawn (prediction), so inference-time
stochastic attention (agents.layers.stochastic_attention) reaches every block: independent multinomial draws per
head, query row and pass (passes folded into the batch). Dropout is drawn only where a method asks for it
(`Noise.dropout`): the plain model's loss (training regularisation, global RNG), never its prediction, in either
module mode; MC dropout asks for it at prediction too, with a generator. Departures: the encoder is the shared
`EncoderConfig` backbone (any kind works; `ft_features` is theirs); one fused key-value projection instead of
separate W_k, W_v (same function).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agents.base import Controller
from agents.checks import at_least, heads_divide, in_range, positive
from agents.encoders import EncoderConfig, build_encoder
from agents.layers.attention import dropout

FT_ENCODER = EncoderConfig(kind="ft_features", in_dim=8, d_model=192)


@dataclass(frozen=True)
class FTTransformerConfig:
    encoder: EncoderConfig = FT_ENCODER
    """input encoder; `ft_features` is FT-Transformer's feature tokenizer (d_model = d_token, 192 by default)"""
    out_dim: int = 1
    """number of regression targets"""
    n_blocks: int = 3
    """transformer blocks"""
    n_heads: int = 8
    """attention heads per block"""
    attention_dropout: float = 0.2
    """dropout on the attention weights (training only for the plain model)"""
    ffn_dropout: float = 0.1
    """dropout on the ReGLU hidden units"""
    residual_dropout: float = 0.0
    """dropout on each residual branch"""
    ffn_factor: float = 4 / 3
    """ReGLU hidden width as a multiple of d_model"""

    def __post_init__(self) -> None:
        heads_divide(self, self.encoder.d_model)
        at_least(self, 1, "out_dim", "n_blocks")
        for name in ("attention_dropout", "ffn_dropout", "residual_dropout"):
            in_range(self, name, 0, 1, high_open=True)
        positive(self, "ffn_factor")

    def build(self) -> FTTransformer:
        return FTTransformer(self)


@dataclass
class Noise:
    """What one forward pass randomises. Methods subclass it to carry their own state (contextual dropout's y, KL)."""

    dropout: bool = False
    generator: torch.Generator | None = None


class FTBlock(nn.Module):
    """One pre-norm block. Methods override `mix` (the attention weights) or `ffn_noise` (the FFN hidden)."""

    def __init__(self, cfg: FTTransformerConfig, first: bool):
        super().__init__()
        d = cfg.encoder.d_model
        if d % cfg.n_heads:
            raise ValueError(f"d_model={d} must be divisible by n_heads={cfg.n_heads}")
        self.cfg, self.n_heads, self.hidden = cfg, cfg.n_heads, max(1, int(d * cfg.ffn_factor))
        self.attention_norm = nn.Identity() if first else nn.LayerNorm(d)
        self.q, self.kv, self.out = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)
        self.ffn_norm = nn.LayerNorm(d)
        self.ffn_in, self.ffn_out = nn.Linear(d, 2 * self.hidden), nn.Linear(self.hidden, d)
        for linear in (self.q, self.kv, self.out):
            nn.init.zeros_(linear.bias)

    def forward(self, x: Tensor, last: bool, noise: Noise) -> Tensor:  # (B, T, d) -> (B, T or 1, d)
        b, t, d = x.shape
        h = self.attention_norm(x)
        q_in, x = (h[:, -1:], x[:, -1:]) if last else (h, x)  # the last block: the CLS query only
        q = self.q(q_in).view(b, -1, self.n_heads, d // self.n_heads).transpose(1, 2)  # (B, H, L, dh)
        k, v = self.kv(h).view(b, t, 2, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4).unbind(0)  # (B,H,T,dh)
        heads = self.mix(q, k, v, noise)  # (B, H, L, dh)
        x = x + self._residual(self.out(heads.transpose(1, 2).reshape(b, -1, d)), noise)  # (B, L, d)
        a, g = self.ffn_in(self.ffn_norm(x)).chunk(2, -1)  # (B, L, hidden) each
        u = self.ffn_noise(a * F.relu(g), noise)  # ReGLU
        return x + self._residual(self.ffn_out(u), noise)

    def mix(self, q: Tensor, k: Tensor, v: Tensor, noise: Noise) -> Tensor:
        """Attention heads (B, H, L, dh): SDPA (SA's hook) unless attention dropout is drawn."""
        p = self.cfg.attention_dropout if noise.dropout else 0.0
        if p <= 0:
            return F.scaled_dot_product_attention(q, k, v)
        weights = torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, -1)  # (B, H, L, T)
        return dropout(weights, p, noise.generator) @ v

    def ffn_noise(self, u: Tensor, noise: Noise) -> Tensor:
        return dropout(u, self.cfg.ffn_dropout, noise.generator) if noise.dropout else u

    def _residual(self, r: Tensor, noise: Noise) -> Tensor:
        return dropout(r, self.cfg.residual_dropout, noise.generator) if noise.dropout else r


class FTBackbone(nn.Module):
    """tokenizer -> [tokens, CLS] -> blocks -> LN -> ReLU -> Linear on CLS. (B, ...) -> (B, D)."""

    def __init__(self, cfg: FTTransformerConfig, block: type[FTBlock] = FTBlock):
        super().__init__()
        d = cfg.encoder.d_model
        self.tokenizer = build_encoder(cfg.encoder)
        self.cls = nn.Parameter(torch.empty(d).uniform_(-(d**-0.5), d**-0.5))
        self.blocks = nn.ModuleList(block(cfg, first=i == 0) for i in range(cfg.n_blocks))
        self.head_norm, self.head = nn.LayerNorm(d), nn.Linear(d, cfg.out_dim)

    def tokens(self, x: Tensor) -> Tensor:  # input -> (B, T + 1, d)
        t = self.tokenizer(x)  # (B, T, d)
        return torch.cat([t, self.cls.expand(t.shape[0], 1, -1)], 1)

    def forward(self, x: Tensor, noise: Noise | None = None) -> Tensor:  # input -> (B, D)
        noise = noise or Noise()
        h = self.tokens(x)
        for i, block in enumerate(self.blocks):
            h = block(h, last=i == len(self.blocks) - 1, noise=noise)  # (B, T + 1, d); the last gives (B, 1, d)
        return self.head(F.relu(self.head_norm(h[:, -1])))


def no_decay_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """Their optimizer's parameter groups: no weight decay on the tokenizer, LayerNorms, CLS token and biases."""
    exempt = {id(p) for m in module.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    exempt |= {id(p) for n, p in module.named_parameters() if n.endswith("bias") or n.startswith("tokenizer")}
    exempt |= {id(p) for n, p in module.named_parameters() if n == "cls"}
    params = list(module.parameters())
    return [
        {"params": [p for p in params if id(p) not in exempt], "weight_decay": weight_decay},
        {"params": [p for p in params if id(p) in exempt], "weight_decay": 0.0},
    ]


def flat_call(module: nn.Module, flat: Tensor, *args, **kwargs):
    """module(*args) with its parameters replaced by the flat vector `flat` (weight-space samples: SWAG, IVON)."""
    params, offset = {}, 0
    for name, p in module.named_parameters():
        params[name] = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return torch.func.functional_call(module, params, args, kwargs)


class FTController(Controller):
    """Shared by every method on the FT-Transformer: the backbone `net`, point predictions, MSE, their optimizer."""

    def __init__(self, cfg: FTTransformerConfig, block: type[FTBlock] = FTBlock):
        super().__init__(cfg.out_dim)
        self.cfg = cfg
        self.net = FTBackbone(cfg, block)

    def configure_optimizer(self, lr: float, weight_decay: float, n_train: int) -> torch.optim.Optimizer:
        return torch.optim.AdamW(no_decay_groups(self.net, weight_decay), lr=lr)

    @staticmethod
    def point_moments(mu: Tensor) -> tuple[Tensor, Tensor]:
        return mu, torch.zeros_like(mu)  # (S, B, D) each: a point prediction per sample

    def _loss(self, x: Tensor, y: Tensor) -> Tensor:
        return F.mse_loss(self.net(x, Noise(dropout=True)), y)


class FTTransformer(FTController):
    """The plain deterministic model (the one SA calibrates post hoc): every sample is the same prediction."""

    default_samples = 1

    def _moments(self, x: Tensor, samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        mu = self.net(x)  # (B, D)
        return self.point_moments(mu.expand(samples, *mu.shape))  # (S, B, D)
