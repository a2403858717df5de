"""SWAG and MultiSWAG on the FT-Transformer.

Maddox, Garipov, Izmailov, Vetrov & Wilson, "A Simple Baseline for Bayesian Uncertainty in Deep Learning",
NeurIPS 2019 (Algorithm 1, sec. 4). After each epoch past the start epoch the weights theta_i are collected:

    theta_bar = 1/n sum_i theta_i,   theta2_bar = 1/n sum_i theta_i^2,   Sigma_diag = theta2_bar - theta_bar^2
    D = [theta_i - theta_bar_i]  (the last K columns; theta_bar_i the running mean after collecting theta_i)
    Sigma = 1/2 (Sigma_diag + D D^T / (K - 1))
    theta~ = theta_bar + (1/sqrt 2) Sigma_diag^{1/2} z1 + (1/sqrt(2 (K - 1))) D z2,   z1 ~ N(0, I_P), z2 ~ N(0, I_K)

and the predictive is the average over S sampled networks (their S = 30, K = 20). MultiSWAG (Wilson & Izmailov,
"Bayesian Deep Learning and a Probabilistic Perspective of Generalization", NeurIPS 2020): M independently
initialised SWAG models, the predictive an equal mixture of their samples (sample s from model s mod M).

Departures: the iterates come from whatever learning-rate schedule the trainer runs (the paper collects at a
constant or cyclical high SWA rate; our trainer owns the schedule, this file only collects); the start is a fraction
of the epochs (`swa_start`, 0.5 ~ their 161 of 300) since a config cannot know the trainer's epoch count. No BatchNorm
in the backbone, so no statistics update after sampling. MultiSWAG's models see the same minibatches (as the deep
ensemble here); their loss is the mean of the models' losses. Before any collection the posterior is the current
weights (every sample the same). K - 1 uses the columns actually stored; the low-rank term needs two.
Moments are kept as buffers, so a checkpoint holds the posterior and reloads it without the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector

from agents.base import Controller
from agents.checks import at_least, in_range
from agents.ft_transformer import FTBackbone, FTController, FTTransformerConfig, Noise, flat_call, no_decay_groups


@dataclass(frozen=True)
class SWAGConfig(FTTransformerConfig):
    max_rank: int = 20
    """K: columns of the deviation matrix D"""
    swa_start: float = 0.5
    """collect after each epoch past this fraction of the training epochs"""
    n_samples: int = 30
    """sampled networks S for a prediction"""

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "max_rank", "n_samples")
        in_range(self, "swa_start", 0, 1, high_open=True)

    def build(self) -> SWAG:
        return SWAG(self)


@dataclass(frozen=True)
class MultiSWAGConfig(SWAGConfig):
    n_models: int = 10
    """independently trained SWAG models M (the SA paper's 10-seed MultiSWAG)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "n_models")

    def build(self) -> MultiSWAG:
        return MultiSWAG(self)


class SWAGPosterior(nn.Module):
    """One network and its SWAG moments (buffers): collect, sample, dense covariance for small checks."""

    def __init__(self, cfg: SWAGConfig):
        super().__init__()
        self.net = FTBackbone(cfg)
        n = sum(p.numel() for p in self.net.parameters())
        self.register_buffer("mean", torch.zeros(n))
        self.register_buffer("sq_mean", torch.zeros(n))
        self.register_buffer("deviations", torch.zeros(cfg.max_rank, n))  # ring buffer of the last K columns
        self.register_buffer("n_collected", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def collect(self) -> None:
        theta = parameters_to_vector(self.net.parameters())  # (P,)
        n = int(self.n_collected) + 1
        self.mean.mul_((n - 1) / n).add_(theta / n)
        self.sq_mean.mul_((n - 1) / n).add_(theta**2 / n)
        self.deviations[(n - 1) % self.deviations.shape[0]] = theta - self.mean
        self.n_collected.fill_(n)

    def columns(self) -> Tensor:  # (k, P), k = min(n, K) stored deviation columns
        return self.deviations[: min(int(self.n_collected), self.deviations.shape[0])]

    def diag_var(self) -> Tensor:  # (P,)
        return (self.sq_mean - self.mean**2).clamp_min(0)

    def covariance(self) -> Tensor:
        """Sigma = 1/2 (Sigma_diag + D D^T / (K - 1)), dense (P, P): for checks on small networks."""
        d = self.columns()
        low_rank = d.T @ d / (d.shape[0] - 1) if d.shape[0] > 1 else torch.zeros(d.shape[1], d.shape[1])
        return 0.5 * (torch.diag(self.diag_var()) + low_rank)

    def sample(self, generator: torch.Generator | None = None) -> Tensor:  # (P,)
        if int(self.n_collected) == 0:
            return parameters_to_vector(self.net.parameters()).detach()
        d = self.columns()
        z1 = torch.randn(self.mean.shape, generator=generator, device=self.mean.device)
        theta = self.mean + self.diag_var().sqrt() * z1 / 2**0.5
        if d.shape[0] > 1:
            z2 = torch.randn(d.shape[0], generator=generator, device=self.mean.device)
            theta = theta + d.T @ z2 / (2 * (d.shape[0] - 1)) ** 0.5
        return theta

    def sampled(self, x: Tensor, generator: torch.Generator | None) -> Tensor:  # (B, D), one sampled network
        return flat_call(self.net, self.sample(generator), x)


class _SWAGBase(Controller):
    def __init__(self, cfg: SWAGConfig, n_models: int):
        super().__init__(cfg.out_dim)
        if cfg.max_rank < 1 or n_models < 1:
            raise ValueError(f"SWAG needs max_rank >= 1 and at least one model, got {cfg.max_rank}, {n_models}")
        self.cfg = cfg
        self.default_samples = cfg.n_samples
        self.models = nn.ModuleList(SWAGPosterior(cfg) for _ in range(n_models))

    def configure_optimizer(self, lr: float, weight_decay: float, n_train: int) -> torch.optim.Optimizer:
        groups = [g for m in self.models for g in no_decay_groups(m.net, weight_decay)]
        return torch.optim.AdamW(groups, lr=lr)

    def on_epoch_end(self, epoch: int, n_epochs: int) -> None:
        if epoch > self.cfg.swa_start * n_epochs:  # epochs count from 1
            for m in self.models:
                m.collect()

    def _moments(self, x: Tensor, samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        mu = torch.stack([self.models[s % len(self.models)].sampled(x, generator) for s in range(samples)])
        return FTController.point_moments(mu)  # (S, B, D)

    def _loss(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.stack([((m.net(x, Noise(dropout=True)) - y) ** 2).mean() for m in self.models]).mean()


class SWAG(_SWAGBase):
    def __init__(self, cfg: SWAGConfig):
        super().__init__(cfg, 1)


class MultiSWAG(_SWAGBase):
    def __init__(self, cfg: MultiSWAGConfig):
        super().__init__(cfg, cfg.n_models)
