"""SDE-Net: a neural SDE whose drift fits the data and whose diffusion measures epistemic uncertainty.

Kong, Sun, Zhang, Tao & Zhang, "SDE-Net: Equipping deep neural networks with uncertainty estimates", ICML 2020.
The hidden state h follows dh_t = f(h_t, t) dt + g(h_0) dW_t over t in [0, T], integrated by Euler-Maruyama

    h_{k+1} = h_k + f(h_k, t_k) dt + g(h_0) sqrt(dt) eps_k,   eps_k ~ N(0, I),   dt = T / n_steps      (their eq. 6)

with h_0 the pooled backbone output. The drift net f is trained with the task loss (here the Gaussian NLL of a
heteroscedastic head on h_T, their regression variant); the diffusion net g(h_0) = sigma_max * sigmoid(.) is
trained as a binary classifier to be small on training inputs and large on out-of-distribution ones (their eq. 9):

    L = NLL(y | h_T) + w * [ BCE(g(h_0(x)) / sigma_max, 0) + BCE(g(h_0(x_ood)) / sigma_max, 1) ].

S Brownian paths give S Gaussians (mu_s, sigma_s^2); their spread is the epistemic variance, the mean of sigma_s^2
the aleatoric one.

Departures and why: the paper alternates two SGD optimisers (drift/encoder on the task loss, diffusion on the
classification loss); here one AdamW step minimises the sum and h_0 is detached in the diffusion term, which gives
the same gradients to each part (the diffusion loss cannot shape the encoder, as in their separate optimiser).
OOD surrogates are Gaussian perturbations x + ood_std * std(x) * eps of the inputs (their regression experiments
add N(0, 2^2) noise to standardised inputs; scaling by the batch std makes one option fit features and pixels alike).
The encoder runs once per prediction; only the SDE and head are sampled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agents.base import Controller, gaussian_nll
from agents.checks import at_least, heads_divide, positive
from agents.encoders import EncoderConfig
from agents.lane_noise import lane_noise
from agents.layers.attention import AttentionBackbone, GaussianHead


@dataclass(frozen=True)
class SDENetConfig:
    encoder: EncoderConfig = EncoderConfig()
    """input encoder (shared backbone)"""
    out_dim: int = 1
    """number of regression targets"""
    n_heads: int = 4
    """attention heads"""
    n_steps: int = 4
    """Euler-Maruyama steps over [0, t_end]"""
    t_end: float = 1.0
    """integration horizon T"""
    sigma_max: float = 0.5
    """largest diffusion g(h_0)"""
    ood_std: float = 2.0
    """OOD surrogate noise, in units of the batch's input std"""
    diffusion_weight: float = 1.0
    """weight w of the diffusion classification loss"""
    n_samples: int = 32
    """Brownian paths S for a prediction"""

    def __post_init__(self) -> None:
        heads_divide(self, self.encoder.d_model)
        at_least(self, 1, "out_dim", "n_steps", "n_samples")
        positive(self, "t_end", "sigma_max")
        at_least(self, 0, "ood_std", "diffusion_weight")

    def build(self) -> SDENet:
        return SDENet(self)


class SDENet(Controller):
    lane_sampling = True  # agents/lane_noise.py
    sa_refusal = (
        "SDE-Net integrates a stochastic differential equation in every pass "
        "(its noise would be counted as SA dispersion)"
    )

    def __init__(self, cfg: SDENetConfig):
        super().__init__(cfg.out_dim)
        if cfg.n_steps < 1 or cfg.t_end <= 0:
            raise ValueError(f"SDENetConfig needs n_steps >= 1 and t_end > 0, got {cfg.n_steps}, {cfg.t_end}")
        d = cfg.encoder.d_model
        self.cfg = cfg
        self.default_samples = cfg.n_samples
        self.backbone = AttentionBackbone(cfg.encoder, cfg.n_heads)
        self.drift = nn.Sequential(nn.Linear(d + 1, d), nn.Tanh(), nn.Linear(d, d))
        self.diffusion = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 1))  # logit of g / sigma_max
        self.head = GaussianHead(d, cfg.out_dim)
        self._last: dict[str, Tensor] = {}

    def integrate(self, h0: Tensor, n_paths: int, generator: torch.Generator | None) -> Tensor:
        """(B, d) -> h_T for n_paths Brownian paths, (S, B, d)."""
        g = self.cfg.sigma_max * torch.sigmoid(self.diffusion(h0))  # (B, 1)
        self._last = {"diffusion": g.detach().squeeze(-1)}
        dt = self.cfg.t_end / self.cfg.n_steps
        h = h0.unsqueeze(0).expand(n_paths, *h0.shape)  # (S, B, d)
        for k in range(self.cfg.n_steps):
            t = torch.full((*h.shape[:-1], 1), k * dt, device=h.device, dtype=h.dtype)
            eps = lane_noise(h.shape, generator, 1, dtype=h.dtype, device=h.device)  # (S, B, d)
            h = h + self.drift(torch.cat([h, t], -1)) * dt + g * math.sqrt(dt) * eps
        return h

    def _moments(self, x: Tensor, samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        return self.head(self.integrate(self.backbone(x), samples, generator))  # (S, B, D) each

    def _loss(self, x: Tensor, y: Tensor) -> Tensor:
        h0 = self.backbone(x)  # (B, d)
        mu, var = self.head(self.integrate(h0, 1, None)[0])  # one path per example
        x_float = x.float()
        x_ood = x_float + self.cfg.ood_std * x_float.std() * torch.randn_like(x_float)
        h0_ood = self.backbone(x_ood)
        logit_in, logit_ood = self.diffusion(h0.detach()), self.diffusion(h0_ood.detach())
        separate = F.binary_cross_entropy_with_logits(
            logit_in, torch.zeros_like(logit_in)
        ) + F.binary_cross_entropy_with_logits(logit_ood, torch.ones_like(logit_ood))
        return gaussian_nll(mu, var, y) + self.cfg.diffusion_weight * separate

    def internals(self) -> dict[str, Tensor]:
        return dict(self._last)
