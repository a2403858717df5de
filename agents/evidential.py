"""Deep evidential regression (DER): a Normal-Inverse-Gamma head and the evidence regulariser.

Amini, Schwarting, Soleimany & Rus, "Deep Evidential Regression", NeurIPS 2020. The head outputs the NIG
parameters m = (gamma, nu, alpha, beta) of a prior over (mu, sigma^2): sigma^2 ~ Gamma^-1(alpha, beta),
mu ~ N(gamma, sigma^2 / nu), with nu > 0, alpha > 1, beta > 0 (softplus, +1 for alpha). The loss is

    L_NLL = 0.5 log(pi / nu) - alpha log(Omega) + (alpha + 1/2) log((y - gamma)^2 nu + Omega)
            + log(Gamma(alpha) / Gamma(alpha + 1/2)),          Omega = 2 beta (1 + nu)          (their eq. 8)
    L_R   = |y - gamma| (2 nu + alpha)                                                            (their eq. 9)
    L     = L_NLL + lambda L_R

and the prediction is closed form (their eq. 5):

    mean = gamma,   aleatoric = E[sigma^2] = beta / (alpha - 1),   epistemic = Var[mu] = beta / (nu (alpha - 1)).

`predict` returns that closed form. `moments` (the sampled interface every controller has) draws (mu_s, sigma_s^2)
from the NIG itself, so the law of total variance over many samples converges to the same closed form — a test
checks it. Gamma draws use Marsaglia & Tsang (2000) with the caller's generator (torch's Gamma sampler takes none).

Departures: the shared backbone of this project; lambda defaults to 0.01 (the paper tunes it per task in
[1e-3, 1e-1]); the regulariser is not annealed or offset by a target error (the paper's eq. 9 as published).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agents.base import Controller, Prediction
from agents.checks import at_least, heads_divide
from agents.encoders import EncoderConfig
from agents.layers.attention import AttentionBackbone


@dataclass(frozen=True)
class EvidentialConfig:
    encoder: EncoderConfig = EncoderConfig()
    """input encoder (shared backbone)"""
    out_dim: int = 1
    """number of regression targets"""
    n_heads: int = 4
    """attention heads"""
    reg_weight: float = 0.01
    """lambda, weight of the evidence regulariser |y - gamma| (2 nu + alpha)"""

    def __post_init__(self) -> None:
        heads_divide(self, self.encoder.d_model)
        at_least(self, 1, "out_dim")
        at_least(self, 0, "reg_weight")

    def build(self) -> DeepEvidential:
        return DeepEvidential(self)


def nig_nll(y: Tensor, gamma: Tensor, nu: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
    """Elementwise negative log of the NIG marginal likelihood (a Student-t), Amini et al. eq. 8."""
    omega = 2 * beta * (1 + nu)
    return (
        0.5 * torch.log(math.pi / nu)
        - alpha * torch.log(omega)
        + (alpha + 0.5) * torch.log((y - gamma) ** 2 * nu + omega)
        + torch.lgamma(alpha)
        - torch.lgamma(alpha + 0.5)
    )


def sample_gamma(alpha: Tensor, generator: torch.Generator | None = None, max_rounds: int = 64) -> Tensor:
    """Gamma(alpha, 1) draws for alpha >= 1 by Marsaglia-Tsang rejection, vectorised, reproducible by generator."""
    if torch.any(alpha < 1):
        raise ValueError("sample_gamma needs alpha >= 1 (the NIG head guarantees alpha > 1)")
    d = alpha - 1.0 / 3.0
    c = 1.0 / torch.sqrt(9.0 * d)
    out = torch.empty_like(alpha)
    todo = torch.ones_like(alpha, dtype=torch.bool)
    for _ in range(max_rounds):
        z = torch.randn(alpha.shape, generator=generator, device=alpha.device, dtype=alpha.dtype)
        u = torch.rand(alpha.shape, generator=generator, device=alpha.device, dtype=alpha.dtype)
        v = (1 + c * z) ** 3
        ok = (v > 0) & (torch.log(u) < 0.5 * z**2 + d - d * v + d * torch.log(v.clamp_min(1e-30)))
        take = todo & ok
        out = torch.where(take, d * v, out)
        todo = todo & ~ok
        if not todo.any():
            return out
    raise RuntimeError(f"Marsaglia-Tsang sampler did not accept within {max_rounds} rounds")


class DeepEvidential(Controller):
    lane_sampling = True  # agents/lane_noise.py
    default_samples = 1  # `predict` is closed form; samples only serve the `moments` interface

    def __init__(self, cfg: EvidentialConfig):
        super().__init__(cfg.out_dim)
        self.cfg = cfg
        self.backbone = AttentionBackbone(cfg.encoder, cfg.n_heads)
        self.head = nn.Linear(cfg.encoder.d_model, 4 * cfg.out_dim)
        self._last: dict[str, Tensor] = {}

    def nig(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(gamma, nu, alpha, beta), each (B, D), in standardised target units."""
        gamma, raw_nu, raw_alpha, raw_beta = self.head(self.backbone(x)).chunk(4, dim=-1)
        nu = F.softplus(raw_nu) + 1e-6
        alpha = F.softplus(raw_alpha) + 1.0 + 1e-6
        beta = F.softplus(raw_beta) + 1e-6
        self._last = {"gamma": gamma.detach(), "nu": nu.detach(), "alpha": alpha.detach(), "beta": beta.detach()}
        return gamma, nu, alpha, beta

    def predict(self, x: Tensor, samples: int | None = None, generator: torch.Generator | None = None) -> Prediction:
        gamma, nu, alpha, beta = self.nig(x)
        aleatoric = beta / (alpha - 1)  # E[sigma^2]
        epistemic = aleatoric / nu  # Var[mu]
        scale2 = self.y_scale**2
        return Prediction(gamma * self.y_scale + self.y_loc, aleatoric * self._var_scale(), epistemic * scale2)

    def _moments(self, x: Tensor, samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        gamma, nu, alpha, beta = self.nig(x)  # (B, D) each
        shape = (samples, *gamma.shape)
        sigma2 = beta / sample_gamma(alpha.expand(shape).contiguous(), generator)  # (S, B, D) ~ InvGamma
        eps = torch.randn(shape, generator=generator, device=gamma.device, dtype=gamma.dtype)
        mu = gamma + torch.sqrt(sigma2 / nu) * eps  # (S, B, D) ~ N(gamma, sigma^2 / nu)
        return mu, sigma2

    def _loss(self, x: Tensor, y: Tensor) -> Tensor:
        gamma, nu, alpha, beta = self.nig(x)
        reg = (y - gamma).abs() * (2 * nu + alpha)
        return (nig_nll(y, gamma, nu, alpha, beta) + self.cfg.reg_weight * reg).mean()

    def internals(self) -> dict[str, Tensor]:
        return dict(self._last)
