"""Gaussian maximum likelihood (GMLE): one heteroscedastic network, no epistemic uncertainty.

Nix & Weigend, "Estimating the mean and variance of the target probability distribution", ICNN 1994; the single
network of Lakshminarayanan et al. 2017 (deep ensembles with M = 1). The network outputs a mean mu(x) and a variance
sigma^2(x) = softplus(s(x)) + 1e-6 and is trained by the Gaussian negative log-likelihood

    L = 0.5 * log(2 pi sigma^2(x)) + (y - mu(x))^2 / (2 sigma^2(x)).

The prediction is N(mu, sigma^2): aleatoric variance sigma^2, epistemic variance 0 (one deterministic network
cannot disagree with itself). Departures: the shared encoder -> SelfAttention -> readout backbone of this project
(the NSAC paper's baselines also share the backbone); softplus rather than exp for the variance, which keeps
gradients bounded when a residual is large (Lakshminarayanan et al. use softplus too).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agents.base import Controller, gaussian_nll
from agents.checks import at_least, heads_divide
from agents.encoders import EncoderConfig
from agents.layers.attention import AttentionBackbone, GaussianHead


@dataclass(frozen=True)
class GMLEConfig:
    encoder: EncoderConfig = EncoderConfig()
    """input encoder (shared backbone)"""
    out_dim: int = 1
    """number of regression targets"""
    n_heads: int = 4
    """attention heads"""

    def __post_init__(self) -> None:
        heads_divide(self, self.encoder.d_model)
        at_least(self, 1, "out_dim")

    def build(self) -> GMLE:
        return GMLE(self)


class GMLE(Controller):
    lane_sampling = True  # agents/lane_noise.py
    default_samples = 1

    def __init__(self, cfg: GMLEConfig):
        super().__init__(cfg.out_dim)
        self.cfg = cfg
        self.backbone = AttentionBackbone(cfg.encoder, cfg.n_heads)
        self.head = GaussianHead(cfg.encoder.d_model, cfg.out_dim)

    def _moments(self, x: Tensor, samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        mu, var = self.head(self.backbone(x))  # (B, D) each
        # Deterministic: every "sample" is the same Gaussian, so the epistemic variance is exactly 0.
        return mu.expand(samples, *mu.shape), var.expand(samples, *var.shape)  # (S, B, D)

    def _loss(self, x: Tensor, y: Tensor) -> Tensor:
        mu, var = self.head(self.backbone(x))
        return gaussian_nll(mu, var, y)
