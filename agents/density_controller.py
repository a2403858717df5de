"""A trained controller whose epistemic signal is the density of its encoder features under the training data's:
the single-pass, feature-space reference the OOD literature would expect beside sampling methods.

Mukhoti, Kirsch, van Amersfoort, Torr & Gal, "Deep Deterministic Uncertainty: A New Simple Baseline" (CVPR 2023):
one deterministic network, a Gaussian density fitted on its features after training, and the feature's (negative
log) density as the epistemic uncertainty; Lee, Lee, Lee & Shin (NeurIPS 2018) score a Gaussian's Mahalanobis
distance the same way. Here, for a controller trained by `drive train`:

    f(x)          = for each encoder e of the base, the mean and the standard deviation of its T output tokens,
                    concatenated: (B, F), F = E * 2d (the encoder runs once: agents/layers/token_cache.py)
    (mu, Sigma)   = mean and covariance of f over the base's training split, Sigma shrunk toward s * I by the
                    Ledoit-Wolf weight (the closed form of Ledoit & Wolf 2004; F is in the hundreds, the frames in
                    the thousands, so the sample covariance alone is ill-conditioned)
    score(x)      = (f - mu)^T Sigma^-1 (f - mu) / F / m,   m = the median score of the validation split

`predict` returns the base's deterministic pass (GMLE, DE, DER: their predictive; NSAC: its mean-logit pass; the
aleatoric temperature included) as mean and aleatoric variance, and score(x) as the epistemic "variance" of every
target: **it is not a variance** but a distance, 1 at a typical validation frame; the gate and the misbehaviour
monitors read it through the same channel, and their thresholds are quantiles, so its scale does not matter.

Departures from DDU, each for a reason: (1) post hoc, on a network trained without DDU's spectral normalisation
and residual connections, which DDU uses against feature collapse: training a new network would not be the
reference for the trained one; (2) one Gaussian, not one per class (GDA): regression has no classes; (3) the
features are the encoder's pooled tokens, before attention, the same for every controller. Deterministic: it
draws nothing (`lane_sampling`: a batch of lanes gives each row what a batch of one does). `drive density fit
--ckpt X --out D` fits it and writes D/density_controller.pt, which every `--ckpt` command drives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from agents.base import Controller, Prediction
from agents.checks import at_least
from agents.encoders import EncoderConfig
from agents.layers.token_cache import cached_encoders, chunked_pass
from agents.wrapper import Wrapper, derive_from_base


@dataclass(frozen=True)
class DensityControllerConfig:
    base: str
    """registry name of the trained controller (agents/registry.py CONTROLLERS)"""
    base_config: Any
    """its config (the dataclass; a dict in the checkpoint, rebuilt by agents/registry.py)"""
    features: int
    """F: the feature dimension the density is fitted in (E encoders x 2 d_model)"""
    batch_size: int = 512
    """rows per encoder batch and per forward chunk (bounds memory)"""
    encoder: EncoderConfig = field(init=False)
    """the base's encoder (derived, as every wrapper's)"""
    out_dim: int = field(init=False)
    """the base's number of targets (derived)"""

    def __post_init__(self) -> None:
        at_least(self, 1, "features", "batch_size")
        derive_from_base(self)

    def build(self) -> DensityController:
        return DensityController(self)


def pooled_features(tokens: Tensor) -> Tensor:
    """(B, E, T, d) encoder tokens -> (B, E * 2d): each encoder's token mean and standard deviation."""
    mean, std = tokens.mean(2), tokens.std(2, unbiased=False)
    return torch.cat([mean, std], -1).flatten(1)


def ledoit_wolf(features: Tensor) -> tuple[Tensor, Tensor, float]:
    """(mean (F,), shrunk covariance (F, F), shrinkage weight) of (N, F) features, float64 (Ledoit & Wolf 2004)."""
    x = features.double()
    n = len(x)
    mu = x.mean(0)
    xc = x - mu
    sample = xc.T @ xc / n
    target = torch.trace(sample) / len(sample)
    d2 = ((sample - target * torch.eye(len(sample), dtype=x.dtype)) ** 2).sum()
    # sum_i ||x_i x_i^T - S||^2 without the (F, F) outer products: ||x_i||^4 - 2 x_i^T S x_i + ||S||^2
    b2 = ((xc**2).sum(1) ** 2 - 2 * ((xc @ sample) * xc).sum(1) + (sample**2).sum()).sum() / n**2
    weight = float(min(b2, d2) / d2) if d2 > 0 else 1.0
    return mu, weight * target * torch.eye(len(sample), dtype=x.dtype) + (1 - weight) * sample, weight


class DensityController(Wrapper):
    lane_sampling = True  # it draws nothing
    default_samples = 1
    #: SA would resample the base's attention, which this controller's signal does not read
    sa_refusal = "its epistemic signal is a feature density, not a spread of passes (calibrate its base instead)"
    made_by = "`drive density fit` it"
    feature_loc: Tensor  # (F,) buffers: the training features' mean, the shrunk covariance's inverse
    feature_precision: Tensor  # (F, F)
    score_scale: Tensor  # (): the validation split's median raw score

    def __init__(self, cfg: DensityControllerConfig, base: Controller | None = None):
        super().__init__(cfg.base_config.build() if base is None else base)
        self.cfg = cfg
        self.register_buffer("feature_loc", torch.zeros(cfg.features))
        self.register_buffer("feature_precision", torch.eye(cfg.features))
        self.register_buffer("score_scale", torch.ones(()))

    @torch.no_grad()
    def features(self, x: Tensor) -> Tensor:
        """(B, F) pooled encoder features of inputs x."""
        with cached_encoders(self.base, self.cfg.batch_size) as tokens:
            return pooled_features(tokens(x))

    @torch.no_grad()
    def fit(self, train: Tensor, val: Tensor) -> dict[str, float]:
        """Fit the density on (N, F) training features and its scale on validation features; the fit's figures."""
        if train.shape[1] != self.cfg.features or val.shape[1] != self.cfg.features:
            raise ValueError(f"features must be (N, {self.cfg.features}), got {tuple(train.shape)}, {tuple(val.shape)}")
        mu, cov, weight = ledoit_wolf(train)
        self.feature_loc.copy_(mu.float())
        self.feature_precision.copy_(torch.linalg.inv(cov).float())
        self.score_scale.fill_(1.0)
        scale = float(self._score(val).double().quantile(0.5))
        self.score_scale.fill_(scale)
        return {"shrinkage": weight, "median_raw_score_val": scale, "n_train": len(train), "n_val": len(val)}

    def _score(self, f: Tensor) -> Tensor:
        z = f - self.feature_loc
        return ((z @ self.feature_precision) * z).sum(-1) / self.cfg.features / self.score_scale  # (B,)

    @torch.no_grad()
    def predict(self, x: Tensor, samples: int | None = None, generator: torch.Generator | None = None) -> Prediction:
        with cached_encoders(self.base, self.cfg.batch_size) as tokens:
            t = tokens(x)
            p = chunked_pass(self.base, t, self.cfg.batch_size)  # standardised units, temperature included
        score = self._score(pooled_features(t))
        scale = self.base.y_scale
        return Prediction(
            p.mean * scale + self.base.y_loc, p.aleatoric_var * scale**2, score[:, None].expand_as(p.mean)
        )

    def moments(self, x: Tensor, samples: int = 1, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """One deterministic "sample": the base's pass, (1, B, D) each, original units (the score is not in it)."""
        p = self.predict(x)
        return p.mean[None], p.aleatoric_var[None]
