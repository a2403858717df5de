"""Post-hoc calibration of predictive spreads: temperature scaling, split-conformal rescaling, matched-coverage width.

The SA paper compares sharpness only at comparable calibration: baselines are rescaled on a held-out calibration
split by one scalar, "via temperature scaling [Guo et al. 2017] or conformal prediction [Vovk et al. 2005]", and
interval widths are compared at matched coverage. Tensors (or arrays) in, tensors out; no model imports. Shapes:
`mean`, `std`, `y` are any one shape (e.g. (N, D)); every element is one calibration case (coordinates pooled, as
one scalar is fitted).

- Temperature scaling: one factor T on the predictive std, fitted by the Gaussian NLL of N(mean, (T std)^2) on the
  calibration split. The minimiser is closed-form, T^2 = mean(((y - mean) / std)^2) (d/dT of
  sum log(T std) + r^2 / (2 T^2 std^2) vanishes there), so no optimiser is needed.
- Split-conformal rescaling: scores r_i = |y_i - mean_i| / std_i on the calibration split (n of them); the
  finite-sample-corrected quantile q = the ceil((n + 1) c)-th smallest score gives intervals mean +- q std with
  coverage >= c on exchangeable test data (Vovk et al.; Lei et al. 2018). As a scale on the std: s = q / z_{(1+c)/2},
  so the Gaussian central c-interval of the rescaled std is exactly the conformal interval. ceil((n + 1) c) > n
  (too few calibration cases for c) gives q = inf.
- Aleatoric temperature at a target coverage: only the noise part of a total-variance predictive is rescaled,
  N(mean, T^2 a + v) (a aleatoric, v epistemic variance), so the epistemic signal stays as it is. Case i is covered
  by the central c-interval iff |y_i - mean_i| <= z sqrt(T^2 a_i + v_i), i.e. iff T >= t_i with
  t_i = sqrt(max(0, (r_i / z)^2 - v_i) / a_i); the finite-sample conformal choice is the ceil((n + 1) c)-th
  smallest t_i (coverage >= c on exchangeable data, as above), one T per output dimension.
- Width at matched coverage: conformal scale fitted on the calibration split, then mean width and achieved coverage
  of the rescaled c-intervals on the test split.
For sample-based predictives (SA, SWAG, ...): summarise by the sample mean and std, or `rescale_samples` to apply a
fitted scale to the samples themselves (spread around their mean).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


class MatchedWidth(NamedTuple):
    width: Tensor  # mean interval width on the test split (scalar)
    coverage: Tensor  # achieved coverage on the test split (scalar)
    scale: Tensor  # the conformal scale on the std fitted on the calibration split (scalar)


def _t(*arrays) -> list[Tensor]:
    out = [torch.as_tensor(a) for a in arrays]
    dtype = torch.promote_types(out[0].dtype, torch.float32)
    return [a.to(dtype) for a in out]


def gaussian_quantile(coverage: float) -> float:
    """z with P(|Z| <= z) = coverage for Z ~ N(0, 1)."""
    if not 0 < coverage < 1:
        raise ValueError(f"coverage must be in (0, 1), got {coverage}")
    return math.sqrt(2) * torch.special.erfinv(torch.tensor(coverage, dtype=torch.float64)).item()


def standardised_residuals(mean, std, y) -> Tensor:
    mean, std, y = _t(mean, std, y)
    if (std <= 0).any():
        raise ValueError("every std must be positive (a point prediction has no spread to rescale)")
    return ((y - mean) / std).abs().flatten()  # (n,)


def fit_temperature(mean, std, y) -> Tensor:
    """T minimising the Gaussian NLL of N(mean, (T std)^2) on the calibration split (closed form)."""
    return standardised_residuals(mean, std, y).square().mean().sqrt()


def conformal_quantile(mean, std, y, coverage: float = 0.95) -> Tensor:
    """q: the ceil((n + 1) coverage)-th smallest |y - mean| / std (inf when that exceeds n)."""
    gaussian_quantile(coverage)  # validates coverage
    scores = standardised_residuals(mean, std, y)
    k = math.ceil((scores.numel() + 1) * coverage)
    if k > scores.numel():
        return torch.tensor(math.inf, dtype=scores.dtype)
    return scores.kthvalue(k).values


def fit_conformal_scale(mean, std, y, coverage: float = 0.95) -> Tensor:
    """s with mean +- z_{(1+c)/2} s std = the split-conformal c-interval (a std rescaling, like T)."""
    return conformal_quantile(mean, std, y, coverage) / gaussian_quantile(coverage)


def gaussian_interval(mean, std, coverage: float = 0.95, scale=1.0) -> tuple[Tensor, Tensor]:
    """Central Gaussian interval mean +- z_{(1+c)/2} scale std, each the shape of mean."""
    mean, std = _t(mean, std)
    half = gaussian_quantile(coverage) * torch.as_tensor(scale, dtype=std.dtype) * std
    return mean - half, mean + half


def coverage_of(lower, upper, y) -> Tensor:
    """Fraction of cases inside [lower, upper] (scalar)."""
    lower, upper, y = _t(lower, upper, y)
    return ((y >= lower) & (y <= upper)).to(y.dtype).mean()


def mean_width(lower, upper) -> Tensor:
    lower, upper = _t(lower, upper)
    return (upper - lower).mean()


def width_at_coverage(cal: tuple, test: tuple, coverage: float = 0.95) -> MatchedWidth:
    """Conformal scale from cal = (mean, std, y); mean width and coverage of the rescaled intervals on test."""
    scale = fit_conformal_scale(cal[0], cal[1], cal[2], coverage)
    mean, std, y = test
    lower, upper = gaussian_interval(mean, std, coverage, scale)
    return MatchedWidth(mean_width(lower, upper), coverage_of(lower, upper, y), scale)


def rescale_samples(samples, scale) -> Tensor:
    """Samples (S, ...) with their spread around the sample mean multiplied by `scale`."""
    (samples,) = _t(samples)
    center = samples.mean(0, keepdim=True)
    return center + torch.as_tensor(scale, dtype=samples.dtype) * (samples - center)


def fit_aleatoric_temperature(mean, aleatoric_var, epistemic_var, y, coverage: float = 0.9) -> Tensor:
    """T (D,) per output column of (N, D) arrays: the smallest factor on the aleatoric std whose central
    `coverage`-interval of N(mean, T^2 a + v) covers ceil((N + 1) coverage) of the N cases (inf if N is too few)."""
    z = gaussian_quantile(coverage)
    mean, a, v, y = _t(mean, aleatoric_var, epistemic_var, y)
    if (a <= 0).any():
        raise ValueError("every aleatoric variance must be positive")
    need = (((y - mean).abs() / z).square() - v).clamp_min(0)  # (N, D): T^2 a_i must reach this
    t = (need / a).sqrt()  # (N, D) the smallest T covering case i
    n = t.shape[0]
    k = math.ceil((n + 1) * coverage)
    if k > n:
        return torch.full((t.shape[1],), math.inf, dtype=t.dtype)
    return t.kthvalue(k, dim=0).values  # (D,)
