"""Hierarchical stochastic attention (HSA) on the FT-Transformer.

Pei, Wang & Szarvas, "Transformer Uncertainty Estimation with Hierarchical Stochastic Attention", AAAI 2022:
self-attention made stochastic at two levels, both by the Gumbel-softmax trick (Jang et al. 2017; Maddison et al.
2017), GS_tau(s) = softmax((s + g) / tau), g ~ Gumbel(0, 1) i.i.d.:

    level 1 (centroids): each key head is replaced by a mixture of sampled centroids from a learnable set
        C = {c_1 .. c_K} per head:  k~_j = sum_c GS_tau1(k_j . c_c / sqrt(dh))_c  c_c
    level 2 (values):   a_t = GS_tau2(q_t . k~_j / sqrt(dh))_j,   o_t = sum_j a_tj v_j

so every sample of either weight vector lies on the simplex (sums to one over centroids / keys). The noise is on in
training (the method learns under it) and in prediction, where S passes give the predictive (point predictions,
var 0, as for every FT-Transformer method here). Our reading of the paper's text (abstract and method: "attends to
values and a set of learnable centroids ... new attention heads are formed with a mixture of sampled centroids");
choices where it is silent: K = 8 centroids per head, tau1 = tau2 = 1, centroids initialised N(0, 1/dh), the
Gumbel noise from the pass's `generator`. The attention is an explicit softmax (the noise enters before it), so SA
does not apply on top of HSA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from agents.checks import at_least, positive
from agents.ft_transformer import FTBlock, FTController, FTTransformerConfig, Noise
from agents.layers.attention import dropout


@dataclass(frozen=True)
class HSAConfig(FTTransformerConfig):
    n_centroids: int = 8
    """K: learnable key centroids per head"""
    tau_centroids: float = 1.0
    """Gumbel-softmax temperature of the key -> centroid assignment"""
    tau_attention: float = 1.0
    """Gumbel-softmax temperature of the attention over keys"""
    n_samples: int = 32
    """Monte-Carlo samples S for a prediction"""

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "n_centroids", "n_samples")
        positive(self, "tau_centroids", "tau_attention")

    def build(self) -> HSA:
        return HSA(self)


def gumbel_softmax(scores: Tensor, tau: float, generator: torch.Generator | None = None) -> Tensor:
    """softmax((s + g) / tau) along the last axis, g ~ Gumbel(0, 1) from `generator`."""
    u = torch.rand(scores.shape, generator=generator, device=scores.device, dtype=scores.dtype)
    g = -torch.log(-torch.log(u.clamp(1e-10, 1 - 1e-7)))
    return torch.softmax((scores + g) / tau, -1)


class HSABlock(FTBlock):
    def __init__(self, cfg: HSAConfig, first: bool):
        super().__init__(cfg, first)
        dh = cfg.encoder.d_model // cfg.n_heads
        self.centroids = nn.Parameter(torch.randn(cfg.n_heads, cfg.n_centroids, dh) * dh**-0.5)  # (H, K, dh)
        self.last_weights: dict[str, Tensor] = {}

    def mix(self, q: Tensor, k: Tensor, v: Tensor, noise: Noise) -> Tensor:  # (B, H, L|T, dh) -> (B, H, L, dh)
        cfg, scale = self.cfg, q.shape[-1] ** -0.5
        to_centroids = gumbel_softmax(
            k @ self.centroids.transpose(-2, -1).unsqueeze(0) * scale, cfg.tau_centroids, noise.generator
        )  # (B, H, T, K)
        k_mixed = to_centroids @ self.centroids.unsqueeze(0)  # (B, H, T, dh)
        attention = gumbel_softmax(
            q @ k_mixed.transpose(-2, -1) * scale, cfg.tau_attention, noise.generator
        )  # (B,H,L,T)
        self.last_weights = {"centroids": to_centroids.detach(), "attention": attention.detach()}
        if noise.dropout:  # the backbone's attention dropout, a training regulariser as in the plain model
            attention = dropout(attention, cfg.attention_dropout, noise.generator)
        return attention @ v


class HSA(FTController):
    def __init__(self, cfg: HSAConfig):
        if cfg.n_centroids < 1 or min(cfg.tau_centroids, cfg.tau_attention) <= 0:
            raise ValueError("HSA needs n_centroids >= 1 and positive temperatures")
        super().__init__(cfg, HSABlock)
        self.default_samples = cfg.n_samples

    def internals(self) -> dict[str, Tensor]:
        """The last pass's sampled weights per block: centroid assignments (B, H, T, K), attention (B, H, L, T)."""
        return {f"{name}_{i}": w for i, blk in enumerate(self.net.blocks) for name, w in blk.last_weights.items()}

    def _moments(self, x: Tensor, samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        b = x.shape[0]
        tiled = x.repeat(samples, *([1] * (x.dim() - 1)))  # (S*B, ...): independent Gumbel noise per row
        mu = self.net(tiled, Noise(generator=generator))  # (S*B, D)
        return self.point_moments(mu.view(samples, b, -1))  # (S, B, D)
