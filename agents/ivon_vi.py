"""IVON on the FT-Transformer: variational learning with the `ivon-opt` optimizer.

Shen, Daheim, Cong, Nickl, Marconi, Bazan, Yokota, Gurevych, Cremers, Khan & Moellenhoff, "Variational Learning is
Effective for Large Deep Networks", ICML 2024. A diagonal Gaussian posterior q = N(m, diag(sigma^2)) over the weights,

    sigma^2 = 1 / (lambda (h + delta)),   lambda = effective sample size (the training-set size), delta = prior
    precision (IVON's weight decay), h = the running Hessian estimate (reparameterisation-trick "price" estimator),

is learned by the IVON optimizer (package `ivon-opt` 0.1.3, imported as `ivon`, only when training): each step
draws theta ~ q, takes the gradient of the loss there (`sampled_params(train=True)`), and updates m, h and the
momentum (their Algorithm 1). The predictive averages S networks theta_s ~ q. Hooks: `configure_optimizer` returns
IVON (ess = n_train), `training_step` runs its sampled step, and after each step h is copied into the
`posterior_hess` buffer, so a checkpoint holds q and prediction samples theta_s = m + sigma eps from the buffers with
a `torch.Generator` (IVON's own `sampled_params` draws from the global RNG and needs the optimizer).

Loss: the MSE of the point predictor, i.e. the per-example Gaussian NLL with variance 1/2 in standardised units, the
mean over the batch as IVON expects (lambda scales it to the data set). Departures: IVON's learning rate and prior
precision are this config's (`lr`, `prior_precision`, the package defaults but lr) because they do not mean what the
trainer's AdamW lr / weight decay mean; the trainer's gradient clipping is applied to the sampled gradient; the
backbone's dropout is off in IVON's loss (the weight noise is the regulariser, and dropout noise would enter the
"price" Hessian estimator, which correlates the weight noise with the gradient).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils import parameters_to_vector

from agents.checks import at_least, in_range, positive
from agents.ft_transformer import FTController, FTTransformerConfig, flat_call


@dataclass(frozen=True)
class IVONConfig(FTTransformerConfig):
    lr: float = 0.1
    """IVON learning rate (the IVON paper's range is 0.1-0.5; the trainer's lr is for AdamW and not used)"""
    prior_precision: float = 1e-4
    """delta, IVON's weight decay (package default)"""
    hess_init: float = 1.0
    """initial Hessian estimate h_0 (package default)"""
    beta2: float = 0.99999
    """Hessian EMA rate (package default)"""
    train_samples: int = 1
    """weight samples per training step (IVON's mc_samples)"""
    n_samples: int = 32
    """posterior samples S for a prediction"""

    def __post_init__(self) -> None:
        super().__post_init__()
        positive(self, "lr", "hess_init")
        at_least(self, 0, "prior_precision")
        in_range(self, "beta2", 0, 1)
        at_least(self, 1, "train_samples", "n_samples")

    def build(self) -> IVONRegressor:
        return IVONRegressor(self)


class IVONRegressor(FTController):
    def __init__(self, cfg: IVONConfig):
        super().__init__(cfg)
        self.default_samples = cfg.n_samples
        n = sum(p.numel() for p in self.net.parameters())
        self.register_buffer("posterior_hess", torch.full((n,), cfg.hess_init))
        self.register_buffer("ess", torch.ones(()))  # lambda, set from the training-set size

    def configure_optimizer(self, lr: float, weight_decay: float, n_train: int) -> torch.optim.Optimizer:
        try:
            import ivon  # only training needs the package: prediction samples from the buffers
        except ImportError as err:
            raise ImportError("ft-ivon training needs the IVON optimizer: pip install ivon-opt==0.1.3") from err
        cfg = self.cfg
        self.ess.fill_(float(n_train))
        return ivon.IVON(
            self.net.parameters(),
            lr=cfg.lr,
            ess=float(n_train),
            hess_init=cfg.hess_init,
            beta2=cfg.beta2,
            weight_decay=cfg.prior_precision,
            mc_samples=cfg.train_samples,
        )

    def training_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer, grad_clip: float) -> Tensor:
        losses = []
        for _ in range(self.cfg.train_samples):
            with optimizer.sampled_params(train=True):  # theta ~ q while the gradient is taken
                optimizer.zero_grad(set_to_none=False)
                loss = self.loss(x, y)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"non-finite training loss {loss.item()}")
                loss.backward()
                if grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(self.net.parameters(), grad_clip)
            losses.append(loss.detach())
        optimizer.step()
        with torch.no_grad():
            self.posterior_hess.copy_(optimizer.param_groups[0]["hess"])
        return torch.stack(losses).mean()

    def _loss(self, x: Tensor, y: Tensor) -> Tensor:
        return F.mse_loss(self.net(x), y)

    def posterior_var(self) -> Tensor:  # (P,) sigma^2 = 1 / (lambda (h + delta))
        return 1.0 / (self.ess * (self.posterior_hess + self.cfg.prior_precision))

    def _moments(self, x: Tensor, samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        mean = parameters_to_vector(self.net.parameters())
        std = self.posterior_var().sqrt()
        draws = [mean + std * torch.randn(mean.shape, generator=generator, device=mean.device) for _ in range(samples)]
        return self.point_moments(torch.stack([flat_call(self.net, theta, x) for theta in draws]))  # (S, B, D)
