"""The published Bayesian-optimisation routine for a scale parameter: Yadav & Zhang (the routine SA cites).

Yadav & Zhang, "Bayesian Optimization under Uncertainty for Training a Scale Parameter in Stochastic Models"
(arXiv 2510.06439), as their code runs it (github.com/UQUH/SO-BO-scale, Ex1/BO: Ex1_BO.m, BOpolicy.m, lmFun.m,
rNIG.m, optimGLM.m, fGLM.m). A stochastic model with scale beta (here nu) produces random distances d; the objective
is f(beta) = E[(d(beta) - d0)^2] for a reference distance d0.

- Surrogate (a Bayesian GLM): ln d = ln b + a ln beta + eps, eps ~ N(0, s^2), fitted by least squares to every
  observed (ln beta, ln d); the non-informative prior gives the normal-inverse-chi^2 posterior
  s^2 ~ df s_hat^2 / chi^2_df, (ln b, a) | s^2 ~ N(theta_hat, s^2 (X^T X)^-1), df = n - 2.
- Objective in closed form (d lognormal): f = C2 x^2 + (C1 x - d0)^2, x = beta^a, C1 = b e^{s^2/2},
  C2 = b^2 (e^{2 s^2} - e^{s^2}); minimiser beta* = (d0 / (b e^{1.5 s^2}))^{1/a}.
- Design: 40 initial points equidistant in ln beta over the bounds (rounded); then per iteration 100 posterior
  draws give 100 beta* (Thompson samples), the first 10 are evaluated (a synchronous batch), clipped to the bounds.
- Stop when, in 3 iterations so far, the 98 % quantile over the draws of f_hat(beta*_i) / f_hat(beta*_hat) is below
  1.03 (f_hat, beta*_hat from the point estimate), or after 50 iterations. Result: round(beta*_hat).

This module is numerical only: `observe(nu, k)` returns the distances of the k-th evaluation at nu (several per
evaluation are several rows, e.g. one per example and pass). agents.sa maps L_SA onto it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class PublishedSearch:
    beta: int  # round(beta*_hat) within the bounds
    beta_raw: float  # beta*_hat before rounding and clipping
    n_evals: int  # evaluations (points observed), initial design included
    n_iter: int  # BO iterations after the initial design
    converged: bool  # the stopping rule fired (not the iteration cap)
    slope: float  # a_hat
    intercept: float  # ln b_hat
    noise_var: float  # s_hat^2
    evaluated: list[int]  # every beta observed, in order


def fit_loglog(log_beta: np.ndarray, log_d: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, int]:
    """Least squares of ln d on [1, ln beta] (lmFun.m): theta_hat = (ln b, a), V = (X^T X)^-1, s^2, df."""
    X = np.stack([np.ones_like(log_beta), log_beta], 1)
    V = np.linalg.inv(X.T @ X)
    theta = V @ X.T @ log_d
    df = len(log_d) - 2
    s2 = float(((log_d - X @ theta) ** 2).sum() / max(df, 1))
    return theta, V, s2, df


def optimum(a, log_b, s2, d0: float):
    """beta* = (d0 / (b e^{1.5 s^2}))^{1/a} (optimGLM.m); vectorised over posterior draws."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return np.exp((math.log(d0) - 1.5 * np.asarray(s2) - np.asarray(log_b)) / np.asarray(a))


def objective(beta, a: float, log_b: float, s2: float, d0: float):
    """f(beta) = C2 x^2 + (C1 x - d0)^2, x = beta^a (fGLM.m). Overflow gives inf, as MATLAB's exp does (math.exp
    raised OverflowError on the sa-uci bench, yacht split 0: a large log-noise variance s^2)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        b = np.exp(log_b)
        c2, c1 = b**2 * np.exp(s2) * np.expm1(s2), b * np.exp(s2 / 2)  # e^{2s^2} - e^{s^2}, inf not nan
        x = np.asarray(beta, dtype=float) ** a
        return c2 * x**2 + (c1 * x - d0) ** 2


def search(
    observe: Callable[[int, int], np.ndarray],
    d0: float,
    bounds: tuple[int, int],
    rng: np.random.Generator,
    *,
    n_init: int = 40,
    n_batch: int = 10,
    n_post: int = 100,
    max_iter: int = 50,
    rel_tol: float = 1.03,
    quantile: float = 0.98,
    n_stable: int = 3,
) -> PublishedSearch:
    """Yadav & Zhang's BO loop over an integer scale in `bounds`; defaults are their Ex1 settings."""
    lo, hi = bounds
    log_beta: list[np.ndarray] = []
    log_d: list[np.ndarray] = []
    evaluated: list[int] = []

    def evaluate(beta: int) -> None:
        d = np.asarray(observe(beta, len(evaluated)), dtype=float).ravel()
        d = np.maximum(d, 1e-300)
        log_beta.append(np.full(d.shape, math.log(beta)))
        log_d.append(np.log(d))
        evaluated.append(beta)

    for lb in np.linspace(math.log(lo), math.log(hi), n_init):
        evaluate(int(round(math.exp(lb))))
    good, it, converged = 0, 0, False
    while True:
        theta, V, s2, df = fit_loglog(np.concatenate(log_beta), np.concatenate(log_d))
        log_b0, a0 = theta
        beta_hat = float(optimum(a0, log_b0, s2, d0))
        sigma2 = df * s2 / rng.chisquare(df, n_post)  # (n_post,) rNIG.m
        draws = theta[None] + (rng.standard_normal((n_post, 2)) @ np.linalg.cholesky(V).T) * np.sqrt(sigma2)[:, None]
        betas = optimum(draws[:, 1], draws[:, 0], sigma2, d0)  # (n_post,) Thompson samples of beta*
        with np.errstate(invalid="ignore"):  # inf / inf, and a quantile between infs: not converged
            rel = objective(betas, a0, log_b0, s2, d0) / objective(beta_hat, a0, log_b0, s2, d0)
            good += int(np.nanquantile(np.where(np.isfinite(rel), rel, np.inf), quantile) < rel_tol)
        if good >= n_stable:
            converged = True
            break
        if it >= max_iter:
            break
        it += 1
        for beta in np.clip(np.nan_to_num(betas[:n_batch], nan=hi, posinf=hi, neginf=lo), lo, hi):
            evaluate(int(round(beta)))
    chosen = int(round(np.clip(np.nan_to_num(beta_hat, nan=hi, posinf=hi, neginf=lo), lo, hi)))
    return PublishedSearch(chosen, beta_hat, len(evaluated), it, converged, float(a0), float(log_b0), s2, evaluated)
