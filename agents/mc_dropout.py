"""Monte-Carlo dropout (MCD) with a heteroscedastic Gaussian output.

Gal & Ghahramani, "Dropout as a Bayesian approximation", ICML 2016, with the aleatoric head of Kendall & Gal,
"What uncertainties do we need in Bayesian deep learning for computer vision?", NeurIPS 2017. Dropout with rate p
stays on at prediction time; each of S masks m_s gives a network f_{m_s}(x) = (mu_s(x), sigma_s^2(x)) and

    mean = 1/S sum_s mu_s,   aleatoric = 1/S sum_s sigma_s^2,   epistemic = 1/S sum_s (mu_s - mean)^2

(the law of total variance in agents.base). Training minimises the Gaussian NLL of one dropout sample per example
(Kendall & Gal eq. 8 with the variance in place of the log-variance parameterisation).

Departures: dropout sits where the shared backbone has free activations — on the attention output (before the
residual) and on the pooled readout — not on every weight layer; the encoder runs once and only attention + readout
+ head are sampled, which makes S samples cheap and leaves the encoder shared with the other methods. Gal's prior
length-scale term is replaced by the trainer's AdamW weight decay. Masks come from the `generator` so predictions
are reproducible; they are drawn in eval mode too (the randomness belongs to the method).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agents.base import Controller, gaussian_nll
from agents.checks import at_least, heads_divide, in_range
from agents.encoders import EncoderConfig
from agents.layers.attention import AttentionBackbone, GaussianHead


@dataclass(frozen=True)
class MCDropoutConfig:
    encoder: EncoderConfig = EncoderConfig()
    """input encoder (shared backbone)"""
    out_dim: int = 1
    """number of regression targets"""
    n_heads: int = 4
    """attention heads"""
    dropout: float = 0.1
    """dropout rate p, active in training and prediction"""
    n_samples: int = 32
    """Monte-Carlo samples S for a prediction"""

    def __post_init__(self) -> None:
        heads_divide(self, self.encoder.d_model)
        at_least(self, 1, "out_dim", "n_samples")
        in_range(self, "dropout", 0, 1, high_open=True)

    def build(self) -> MCDropout:
        return MCDropout(self)


class MCDropout(Controller):
    lane_sampling = True  # agents/lane_noise.py
    sa_refusal = "MC dropout draws a dropout mask in every pass (its noise would be counted as SA dispersion)"

    def __init__(self, cfg: MCDropoutConfig):
        super().__init__(cfg.out_dim)
        if not 0 < cfg.dropout < 1:
            raise ValueError(f"MCDropoutConfig.dropout must be in (0, 1), got {cfg.dropout}")
        self.cfg = cfg
        self.default_samples = cfg.n_samples
        self.backbone = AttentionBackbone(cfg.encoder, cfg.n_heads, dropout=cfg.dropout)
        self.head = GaussianHead(cfg.encoder.d_model, cfg.out_dim)

    def _moments(self, x: Tensor, samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        tokens = self.backbone.tokens(x)  # (B, T, d), once
        b = tokens.shape[0]
        tiled = tokens.unsqueeze(0).expand(samples, *tokens.shape).reshape(samples * b, *tokens.shape[1:])
        mu, var = self.head(self.backbone.head_input(tiled, generator))  # (S*B, D), one mask per row
        return mu.view(samples, b, -1), var.view(samples, b, -1)  # (S, B, D)

    def _loss(self, x: Tensor, y: Tensor) -> Tensor:
        mu, var = self.head(self.backbone(x))  # one dropout mask per example
        return gaussian_nll(mu, var, y)
