"""Choosing nu for SA (inference-time stochastic attention, agents/layers/stochastic_attention.py).

Yadav, Adebiyi & Zhang, "Calibrating Scientific Foundation Models with Inference-Time Stochastic Attention" (2026):
on a held-out calibration split, minimise

    L_SA(nu) = E_{x, m} [ ( ||f_nu^(m)(x) - f(x)|| - ||y - f(x)|| )^2 ]

where f is the deterministic model (SA off) and f_nu^(m), m = 1..M, are stochastic passes: the spread of the SA
ensemble around f should match the size of the model's actual error. One univariate problem, solved by Bayesian
optimisation with a log-log linear surrogate (the exact procedure is our reading of the paper's description):

- Surrogate: ln d(nu) = ln b + a ln nu + eps, eps ~ N(0, s^2), for the dispersion d(nu) = E||f_nu(x) - f(x)||
  (the multinomial average has std ~ nu^-1/2, so a is near -1/2 while the model is locally linear). Conjugate
  normal-inverse-chi^2 prior on (ln b, a; s^2), weak, slope centred on -1/2; closed-form posterior.
- Link to L_SA: with deviations ||f_nu - f|| = d(nu) u(x, m), u a nu-free shape of mean 1 (pooled over all
  evaluations), L_SA(nu) = E[(d u - r)^2] with r = ||y - f|| is minimised at d* = E[u r] / E[u^2].
- Thompson sampling: draw (ln b, a) from the posterior and propose nu = exp((ln d* - ln b) / a), within bounds;
  evaluate it (M passes), refit. Stop when the proposed optimum is stable (|ln nu_t - ln nu_t-1| < tol for
  `patience` proposals in a row) or after max_evals. The chosen nu is the posterior-mean optimum.
Every evaluation uses the same seed (common random numbers), so differences between candidates are not noise.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from agents.layers.stochastic_attention import disable_stochastic_attention, is_stochastic, stochastic_attention

log = logging.getLogger(__name__)

Forward = Callable[[nn.Module, Tensor], Tensor]


def _call(model: nn.Module, x: Tensor) -> Tensor:
    return model(x)


@dataclass
class SAEval:
    nu: int
    loss: float  # L_SA estimate
    dispersion: float  # mean ||f_nu - f||
    deviations: Tensor = field(repr=False)  # (M, B) ||f_nu^(m)(x_b) - f(x_b)||


@dataclass
class NuCalibration:
    nu: int
    curve: list[dict[str, float]]  # every evaluation, sorted by nu: nu, loss, dispersion
    wall_time_s: float
    n_evals: int
    converged: bool
    target_dispersion: float
    slope: float  # posterior mean a
    intercept: float  # posterior mean ln b


@torch.no_grad()
def deterministic_output(model: nn.Module, x: Tensor, forward: Forward = _call) -> Tensor:
    if is_stochastic(model):
        raise RuntimeError("stochastic attention is on: f(x) must be computed with SA off")
    return forward(model, x)


@torch.no_grad()
def sa_evaluate(
    model: nn.Module, x: Tensor, y: Tensor, nu: int, n_passes: int = 8, seed: int = 0,
    forward: Forward = _call, base: Tensor | None = None,
) -> SAEval:  # fmt: skip
    """L_SA(nu) from M = n_passes stochastic passes (folded into one batch of M*B inputs)."""
    f0 = deterministic_output(model, x, forward) if base is None else base
    b = x.shape[0]
    res = (y.reshape(b, -1) - f0.reshape(b, -1)).norm(dim=-1)  # (B,)
    generator = torch.Generator(device=x.device).manual_seed(seed)
    with stochastic_attention(model, nu, generator):
        out = forward(model, x.repeat(n_passes, *([1] * (x.dim() - 1))))  # (M*B, ...)
    dev = (out.reshape(n_passes, b, -1) - f0.reshape(1, b, -1)).norm(dim=-1)  # (M, B)
    loss = ((dev - res) ** 2).mean().item()
    return SAEval(int(nu), loss, dev.mean().item(), dev)


def grid_search_nu(
    model: nn.Module, x: Tensor, y: Tensor, nus: list[int], n_passes: int = 8, seed: int = 0, forward: Forward = _call
) -> list[SAEval]:
    """L_SA on a grid (the reference the BO is checked against)."""
    base = deterministic_output(model, x, forward)
    return [sa_evaluate(model, x, y, nu, n_passes, seed, forward, base) for nu in nus]


class LogLogPosterior:
    """Bayesian linear regression ln d = ln b + a ln nu + eps with a conjugate normal-inverse-chi^2 prior."""

    def __init__(self, slope_mean: float = -0.5, slope_sd: float = 1.0, intercept_sd: float = 10.0,
                 dof0: float = 1.0, scale0: float = 0.1):  # fmt: skip
        self.m0 = np.array([0.0, slope_mean])
        self.prec0 = np.diag([intercept_sd**-2, slope_sd**-2])  # V0^-1
        self.dof0, self.scale0 = dof0, scale0

    def fit(self, log_nu: np.ndarray, log_d: np.ndarray) -> LogLogPosterior:
        X = np.stack([np.ones_like(log_nu), log_nu], 1)
        prec = self.prec0 + X.T @ X
        self.cov = np.linalg.inv(prec)  # V_n
        self.mean = self.cov @ (self.prec0 @ self.m0 + X.T @ log_d)  # m_n
        self.dof = self.dof0 + len(log_d)  # nu_n
        ss = self.dof0 * self.scale0 + log_d @ log_d + self.m0 @ self.prec0 @ self.m0 - self.mean @ prec @ self.mean
        self.scale = max(ss, 1e-12) / self.dof  # s_n^2
        return self

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """One Thompson draw of (ln b, a): s^2 ~ Scaled-Inv-chi^2(nu_n, s_n^2), beta ~ N(m_n, s^2 V_n)."""
        s2 = self.dof * self.scale / rng.chisquare(self.dof)
        return rng.multivariate_normal(self.mean, s2 * self.cov)


def _target_dispersion(evals: list[SAEval], res: Tensor) -> float:
    shapes = torch.cat([e.deviations / max(e.dispersion, 1e-30) for e in evals])  # (sum M, B), mean 1 each
    r = res.expand_as(shapes)
    return ((shapes * r).mean() / (shapes**2).mean()).item()


def calibrate_nu(
    model: nn.Module, x: Tensor, y: Tensor, *, forward: Forward = _call, n_passes: int = 8,
    nu_bounds: tuple[int, int] = (2, 1 << 16), n_init: int = 3, max_evals: int = 12, tol: float = 0.1,
    patience: int = 2, seed: int = 0, prior: LogLogPosterior | None = None,
) -> NuCalibration:  # fmt: skip
    """Bayesian optimisation of L_SA over nu on a calibration split (x, y). Leaves SA off on return."""
    start = time.perf_counter()
    disable_stochastic_attention(model)
    lo, hi = nu_bounds
    if not 1 <= lo < hi:
        raise ValueError(f"nu_bounds={nu_bounds} must satisfy 1 <= low < high")
    base = deterministic_output(model, x, forward)
    res = (y.reshape(x.shape[0], -1) - base.reshape(x.shape[0], -1)).norm(dim=-1)  # (B,)
    rng = np.random.default_rng(seed)
    post = prior or LogLogPosterior()
    evals: dict[int, SAEval] = {}

    def evaluate(nu: int) -> None:
        if nu not in evals:
            evals[nu] = sa_evaluate(model, x, y, nu, n_passes, seed, forward, base)
            log.info("SA nu=%d  L_SA=%.5g  dispersion=%.4g", nu, evals[nu].loss, evals[nu].dispersion)

    def clip(log_nu: float) -> int:
        return int(round(min(max(math.exp(min(log_nu, 50.0)), lo), hi)))

    for log_nu in np.linspace(math.log(lo), math.log(hi), n_init):
        evaluate(clip(log_nu))
    if not any(e.dispersion > 0 for e in evals.values()):
        raise RuntimeError("stochastic attention changed no output: the model has no attention SA can reach")
    previous, stable, converged = None, 0, False
    while len(evals) < max_evals:
        d_star = _target_dispersion(list(evals.values()), res)
        post.fit(*_log_points(evals))
        proposal = _thompson(post, rng, d_star)
        nu = clip(proposal)
        stable = stable + 1 if previous is not None and abs(math.log(nu) - math.log(previous)) < tol else 0
        previous = nu
        evaluate(nu)
        if stable >= patience:
            converged = True
            break
    d_star = _target_dispersion(list(evals.values()), res)
    post.fit(*_log_points(evals))
    slope = min(post.mean[1], -1e-6)
    chosen = clip((math.log(max(d_star, 1e-30)) - post.mean[0]) / slope)
    curve = [{"nu": e.nu, "loss": e.loss, "dispersion": e.dispersion} for _, e in sorted(evals.items())]
    return NuCalibration(
        chosen, curve, time.perf_counter() - start, len(evals), converged, d_star, float(post.mean[1]),
        float(post.mean[0]),
    )  # fmt: skip


def _log_points(evals: dict[int, SAEval]) -> tuple[np.ndarray, np.ndarray]:
    nus = np.array([e.nu for e in evals.values()], dtype=float)
    ds = np.array([max(e.dispersion, 1e-30) for e in evals.values()])
    return np.log(nus), np.log(ds)


def _thompson(post: LogLogPosterior, rng: np.random.Generator, d_star: float, tries: int = 20) -> float:
    """ln nu proposed by one posterior draw; a draw with a >= 0 (dispersion not falling with nu) is redrawn."""
    for _ in range(tries):
        log_b, a = post.sample(rng)
        if a < 0:
            return (math.log(max(d_star, 1e-30)) - log_b) / a
    return (math.log(max(d_star, 1e-30)) - post.mean[0]) / min(post.mean[1], -1e-6)
