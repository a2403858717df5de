"""The one predictive interface every controller implements.

A controller maps an input batch to Gaussian moments per stochastic sample:

    moments(x, samples) -> (mu, var), both (S, B, D)      S samples first, always explicit

and the base class turns them into a `Prediction` by the law of total variance:

    mean          = E_s[mu_s]                                (B, D)
    aleatoric_var = E_s[var_s]                               (B, D)   the noise the model predicts
    epistemic_var = Var_s[mu_s]                              (B, D)   disagreement between samples

Targets are standardised inside the controller with statistics fitted on the training split (`set_target_stats`),
held as buffers so they travel with the state_dict; `moments` and `predict` always answer in original units and
`loss` takes targets in original units. Subclasses implement `_moments` and `_loss` in standardised units.
Deep evidential regression overrides `predict` with its closed form.

Aleatoric temperature: a (D,) buffer `aleatoric_temperature` (1 after training) multiplies the predicted noise std,
var_s -> T^2 var_s, in `moments` and `predict`; the per-sample means, hence the action and the epistemic variance
(the fallback gate's and the OOD detector's signal), are untouched. `drive calibrate` fits it post hoc on nominal laps
against the shadow expert (drive/loop/calibrate.py) and stores it in the checkpoint; files written before it existed
load with T = 1.
"""

from __future__ import annotations

import math
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn


class Prediction(NamedTuple):
    mean: Tensor  # (B, D)
    aleatoric_var: Tensor  # (B, D)
    epistemic_var: Tensor  # (B, D)

    @property
    def total_var(self) -> Tensor:
        return self.aleatoric_var + self.epistemic_var


def total_variance(mu: Tensor, var: Tensor) -> Prediction:
    """Law of total variance over the sample axis of (S, B, D) moments.

    The means reduce a contiguous last axis: a row's result then does not depend on the batch size (a mean over
    axis 0 vectorises across the B*D columns and sums in another order for another B; agents/lane_noise.py)."""
    samples = mu.movedim(0, -1).contiguous()  # (B, D, S)
    mean = samples.mean(-1)  # (B, D)
    epistemic = samples.var(-1, unbiased=False) if mu.shape[0] > 1 else torch.zeros_like(mean)
    return Prediction(mean, var.movedim(0, -1).contiguous().mean(-1), epistemic)


def gaussian_nll(mu: Tensor, var: Tensor, y: Tensor) -> Tensor:
    """Mean Gaussian negative log-likelihood, full constant included (comparable across methods)."""
    return 0.5 * (torch.log(2 * math.pi * var) + (y - mu) ** 2 / var).mean()


class Controller(nn.Module):
    """Base class: standardisation buffers, law of total variance, optional internals for tracing."""

    #: default number of stochastic samples for `predict` (1 for deterministic methods)
    default_samples: int = 1
    #: whether `predict` on a batch of closed-loop lanes, given `agents.lane_noise.LaneGenerators`, gives each row
    #: what a batch of one gives (every random draw goes through `lane_noise`); else lanes run one call each
    lane_sampling: ClassVar[bool] = False
    #: for tracing `internals()`: the batch axis of each tensor (default 0), the axis holding the attention heads once
    #: the batch axis is dropped (names absent are not per head), and the tensors that are indices, not values
    internal_batch_axes: ClassVar[dict[str, int]] = {}
    internal_head_axes: ClassVar[dict[str, int]] = {}
    internal_indices: ClassVar[tuple[str, ...]] = ()
    y_loc: Tensor  # (D,) buffers: the training targets' mean and std
    y_scale: Tensor
    aleatoric_temperature: Tensor  # (D,) buffer: post-hoc factor on the predicted noise std (1: as trained)

    def __init__(self, out_dim: int):
        super().__init__()
        self.out_dim = out_dim
        self.register_buffer("y_loc", torch.zeros(out_dim))
        self.register_buffer("y_scale", torch.ones(out_dim))
        self.register_buffer("aleatoric_temperature", torch.ones(out_dim))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[no-untyped-def]
        # files written before the temperature existed hold none: T = 1 (as trained); load_state_dict passes a copy
        state_dict.setdefault(prefix + "aleatoric_temperature", torch.ones(self.out_dim))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # -- standardisation -------------------------------------------------------------------------------------------
    def set_target_stats(self, loc: Tensor, scale: Tensor) -> None:
        self.y_loc.copy_(torch.as_tensor(loc, dtype=self.y_loc.dtype))
        self.y_scale.copy_(torch.as_tensor(scale, dtype=self.y_scale.dtype).clamp_min(1e-6))

    def _standardise(self, y: Tensor) -> Tensor:
        return (y - self.y_loc) / self.y_scale

    def set_aleatoric_temperature(self, temperature: Tensor) -> None:
        """T (D,) or scalar, > 0: the predicted noise std is multiplied by it from now on (1 undoes calibration)."""
        t = torch.as_tensor(temperature, dtype=self.aleatoric_temperature.dtype).expand(self.out_dim)
        if not bool(torch.isfinite(t).all()) or bool((t <= 0).any()):
            raise ValueError(f"an aleatoric temperature must be finite and > 0, got {t.tolist()}")
        self.aleatoric_temperature.copy_(t)

    def _var_scale(self) -> Tensor:
        """(D,) factor from standardised noise variance to calibrated variance in original units."""
        return self.y_scale**2 * self.aleatoric_temperature**2

    # -- the interface ---------------------------------------------------------------------------------------------
    def moments(self, x: Tensor, samples: int = 1, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Per-sample Gaussian moments in original units, each (S, B, D)."""
        mu, var = self._moments(x, samples, generator)
        return mu * self.y_scale + self.y_loc, var * self._var_scale()

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """Training loss (scalar) for targets y (B, D) in original units."""
        return self._loss(x, self._standardise(y))

    def predict(self, x: Tensor, samples: int | None = None, generator: torch.Generator | None = None) -> Prediction:
        mu, var = self.moments(x, samples or self.default_samples, generator)
        return total_variance(mu, var)

    #: why inference-time stochastic attention (SA) cannot calibrate this controller post hoc, or None when it can
    sa_refusal: ClassVar[str | None] = None

    def deterministic_pass(self, x: Tensor) -> Prediction:
        """The prediction without the method's own sampling, in standardised target units: the f(x) SA perturbs.
        By default `predict` (exact for deterministic and closed-form methods, all members for an ensemble)."""
        p = self.predict(x)
        scale2 = self.y_scale**2
        return Prediction((p.mean - self.y_loc) / self.y_scale, p.aleatoric_var / scale2, p.epistemic_var / scale2)

    def internals(self) -> dict[str, Tensor]:
        """Tensors of the last forward worth recording (NSAC: kappa, phi, psi, ...). Empty by default."""
        return {}

    # -- training hooks (the trainer calls these; a method that trains differently overrides them) ----------------
    def configure_optimizer(self, lr: float, weight_decay: float, n_train: int) -> torch.optim.Optimizer:
        """The optimizer the trainer steps (AdamW by default; IVON returns its own). n_train: training examples."""
        return torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=weight_decay)

    def training_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer, grad_clip: float) -> Tensor:
        """One optimisation step on a batch (targets in original units); returns the detached loss."""
        loss = self.loss(x, y)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite training loss {loss.item()}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.parameters(), grad_clip)
        optimizer.step()
        return loss.detach()

    def on_epoch_end(self, epoch: int, n_epochs: int) -> None:
        """Called after each training epoch (SWAG collects its weight moments here). Nothing by default."""

    # -- for subclasses --------------------------------------------------------------------------------------------
    def _moments(self, x: Tensor, samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _loss(self, x: Tensor, y: Tensor) -> Tensor:
        raise NotImplementedError
