"""The default Bayesian optimisation of nu for SA (agents/sa.py explains it and how it departs from the published one).

Surrogate ln d(nu) = ln b + a ln nu + eps, eps ~ N(0, s^2), fitted to each evaluation's mean dispersion with a weak
conjugate normal-inverse-chi^2 prior (slope centred on -1/2); target dispersion d* = E[u r] / E[u^2]; one Thompson
draw per step proposes nu = exp((ln d* - ln b) / a); stop on a stable proposal or at the evaluation budget; the
choice is the posterior-mean optimum. Numerical only: evaluations come from the caller.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass
class OursSearch:
    nu: int
    n_evals: int
    converged: bool
    target_dispersion: float  # d*
    slope: float  # posterior mean a
    intercept: float  # posterior mean ln b


class LogLogPosterior:
    """Bayesian linear regression ln d = ln b + a ln nu + eps with a conjugate normal-inverse-chi^2 prior."""

    def __init__(
        self,
        slope_mean: float = -0.5,
        slope_sd: float = 1.0,
        intercept_sd: float = 10.0,
        dof0: float = 1.0,
        scale0: float = 0.1,
    ):
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


def target_dispersion(evals: list, res: Tensor) -> float:
    """d* = E[u r] / E[u^2], u = deviation / its evaluation's mean dispersion (nu-free shape), r = residual."""
    shapes = torch.cat([e.deviations / max(e.dispersion, 1e-30) for e in evals])  # (sum M, B), mean 1 each
    r = res.expand_as(shapes)
    return ((shapes * r).mean() / (shapes**2).mean()).item()


def search(evaluate, known, res, lo, hi, seed, n_init, max_evals, tol, patience, prior) -> OursSearch:
    """The default BO of nu in [lo, hi]; `evaluate(nu)` returns an evaluation with .nu, .dispersion, .deviations."""
    rng = np.random.default_rng(seed)
    post = prior or LogLogPosterior()
    evals = dict(known)

    def clip(log_nu: float) -> int:
        return int(round(min(max(math.exp(min(log_nu, 50.0)), lo), hi)))

    for log_nu in np.linspace(math.log(lo), math.log(hi), n_init):
        nu = clip(log_nu)
        evals[nu] = evaluate(nu)
    previous, stable, converged = None, 0, False
    while len(evals) < max_evals:
        d_star = target_dispersion(list(evals.values()), res)
        post.fit(*log_points(evals))
        nu = clip(thompson(post, rng, d_star))
        stable = stable + 1 if previous is not None and abs(math.log(nu) - math.log(previous)) < tol else 0
        previous = nu
        evals[nu] = evaluate(nu)
        if stable >= patience:
            converged = True
            break
    d_star = target_dispersion(list(evals.values()), res)
    post.fit(*log_points(evals))
    slope = min(post.mean[1], -1e-6)
    chosen = clip((math.log(max(d_star, 1e-30)) - post.mean[0]) / slope)
    return OursSearch(chosen, len(evals), converged, d_star, float(post.mean[1]), float(post.mean[0]))


def log_points(evals: dict) -> tuple[np.ndarray, np.ndarray]:
    nus = np.array([e.nu for e in evals.values()], dtype=float)
    ds = np.array([max(e.dispersion, 1e-30) for e in evals.values()])
    return np.log(nus), np.log(ds)


def thompson(post: LogLogPosterior, rng: np.random.Generator, d_star: float, tries: int = 20) -> float:
    """ln nu proposed by one posterior draw; a draw with a >= 0 (dispersion not falling with nu) is redrawn."""
    for _ in range(tries):
        log_b, a = post.sample(rng)
        if a < 0:
            return (math.log(max(d_star, 1e-30)) - log_b) / a
    return (math.log(max(d_star, 1e-30)) - post.mean[0]) / min(post.mean[1], -1e-6)
