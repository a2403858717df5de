"""Deep ensembles (DE): M independently initialised heteroscedastic networks.

Lakshminarayanan, Pritzel & Blundell, "Simple and scalable predictive uncertainty estimation using deep
ensembles", NeurIPS 2017. Member m outputs (mu_m(x), sigma_m^2(x)) and is trained by the Gaussian NLL; the
ensemble is the uniform mixture, summarised by its first two moments (their eq. for mu_*, sigma_*^2):

    mean = 1/M sum_m mu_m,   aleatoric = 1/M sum_m sigma_m^2,   epistemic = 1/M sum_m (mu_m - mean)^2.

Departures: every member is a full copy of the shared backbone (encoder -> SelfAttention -> readout -> Gaussian
head), differing only in its random initialisation; members see the same minibatches (the paper shuffles per
member; random initialisation alone gives the diversity in their ablations, and one batch stream keeps the trainer
generic). The optional adversarial-training term of the paper is left out: it needs an input-space epsilon that has
no common meaning across our encoders (features, pixels, sequences). The loss is the mean of the member NLLs.
`moments` with S = M gives the members; another S takes them round-robin (sample s is member s mod M), which
over-weights some members unless S is a multiple of M, so `predict` always uses exactly the M members.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from agents.base import Controller, Prediction, gaussian_nll, total_variance
from agents.checks import at_least, heads_divide
from agents.encoders import EncoderConfig
from agents.layers.attention import AttentionBackbone, GaussianHead


@dataclass(frozen=True)
class EnsembleConfig:
    encoder: EncoderConfig = EncoderConfig()
    """input encoder (shared backbone, one copy per member)"""
    out_dim: int = 1
    """number of regression targets"""
    n_heads: int = 4
    """attention heads"""
    n_members: int = 5
    """ensemble size M (the paper's default)"""

    def __post_init__(self) -> None:
        heads_divide(self, self.encoder.d_model)
        at_least(self, 1, "out_dim", "n_members")

    def build(self) -> DeepEnsemble:
        return DeepEnsemble(self)


class Member(nn.Module):
    def __init__(self, cfg: EnsembleConfig):
        super().__init__()
        self.backbone = AttentionBackbone(cfg.encoder, cfg.n_heads)
        self.head = GaussianHead(cfg.encoder.d_model, cfg.out_dim)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.head(self.backbone(x))  # (B, D) each


class DeepEnsemble(Controller):
    lane_sampling = True  # agents/lane_noise.py

    def __init__(self, cfg: EnsembleConfig):
        super().__init__(cfg.out_dim)
        if cfg.n_members < 1:
            raise ValueError(f"EnsembleConfig.n_members must be >= 1, got {cfg.n_members}")
        self.cfg = cfg
        self.default_samples = cfg.n_members
        self.members = nn.ModuleList(Member(cfg) for _ in range(cfg.n_members))

    def _moments(self, x: Tensor, samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        used = min(samples, len(self.members))
        outs = [self.members[m](x) for m in range(used)]
        mu = torch.stack([o[0] for o in outs])  # (M', B, D)
        var = torch.stack([o[1] for o in outs])
        index = torch.arange(samples, device=mu.device) % used
        return mu[index], var[index]  # (S, B, D)

    def predict(self, x: Tensor, samples: int | None = None, generator: torch.Generator | None = None) -> Prediction:
        """The exact ensemble (all M members) whatever samples: a prediction has no sample axis to fill."""
        return total_variance(*self.moments(x, len(self.members), generator))

    def _loss(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.stack([gaussian_nll(*member(x), y) for member in self.members]).mean()
