"""The SA study's evaluation: any method's predictive as samples, scored natively and after post-hoc calibration.

Yadav, Adebiyi & Zhang, "Calibrating Scientific Foundation Models with Inference-Time Stochastic Attention" (2026),
as the task plugins `sa-uci` and `sa-forecast` run it. Every method (SA on a deterministic model, or a baseline's own
sampling) gives a `Predictive`: S samples per case and a point prediction, in standardised target units (y divided
by the training targets' std, so widths and errors compare across data sets). Per method:

- native (`native_report`, the keys of drive.metrics.regression_report with sample-based definitions, as the paper
  computes them): nrmse = RMSE of the point prediction (standardised units, hence "normalised"); pit_w1 = W1 between
  U(0, 1) and the PIT of the empirical predictive CDF, F(y) = #{s: x_s <= y} / S (S = 32: a calibrated
  predictive's PIT is uniform on {0, 1/S, .., 1}); coverage_L / width_L of the central empirical interval
  [q_(1-L)/2, q_(1+L)/2] of the samples (`sample_quantile`: Weibull positions, unbiased coverage; S = 64 reaches
  the 2.5 % quantile between the first two order statistics); ece from the same PIT; nll Gaussian with the
  samples' mean and variance (floored at 1e-6); crps the ensemble CRPS of the samples (drive.metrics.crps_ensemble);
- temperature scaling on the calibration part (drive.calibration.fit_temperature with the samples' std), then the
  native report of the rescaled samples point + T (x_s - point) (T = 1 gives the native report back);
- split conformal (drive.calibration: scores |y - point| / std) at 95 % and on a grid of levels (`CURVE_LEVELS`):
  width and achieved coverage on the test part. `width_at` reads a method's width at another method's coverage off
  that curve (linear in coverage between grid levels): the paper's "width at matched coverage".
SA's predictive (`sa_predictive`): nu chosen by agents.sa.calibrate_nu on the calibration part (the default
routine), and, for the record, Yadav & Zhang's published routine and a grid on the same part, with L_SA of each
choice re-evaluated on the whole part with the same draws; then S passes with SA on at the chosen nu.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from agents.sa import calibrate_nu, grid_search_nu, sa_evaluate, sa_samples
from datasets.files import atomic_write
from drive import calibration, metrics

CURVE_LEVELS = tuple(round(0.05 * k, 2) for k in range(1, 20)) + (0.975, 0.99)
INTERVALS = (0.5, 0.9, 0.95)
GRID = tuple(2**k for k in range(13))  # nu = 1 .. 4096
STD_FLOOR = 1e-6  # standardised units: a case whose samples all agree still gets a finite NLL and conformal score
Forward = Callable[[nn.Module, Tensor], Tensor]


class Predictive(NamedTuple):
    samples: Tensor  # (S, N, D) standardised target units
    point: Tensor  # (N, D) the method's point prediction (SA: the deterministic f(x); baselines: the sample mean)

    def std(self) -> Tensor:  # (N, D)
        return self.samples.std(0, unbiased=False).clamp_min(STD_FLOOR)


def from_samples(samples: Tensor) -> Predictive:
    return Predictive(samples, samples.mean(0))


def empirical_pit(samples: Tensor, y: Tensor) -> np.ndarray:
    """F(y) of the empirical predictive CDF, #{s: x_s <= y} / S, one value per case: (N * D,)."""
    return (samples <= y.unsqueeze(0)).double().mean(0).flatten().numpy()


def sample_quantile(ordered: Tensor, p: float) -> Tensor:
    """The p-quantile of sorted samples (S, ...) at the Weibull plotting position p (S + 1): E F(x_(k)) = k / (S + 1),
    so the central interval of a calibrated predictive covers its level on average (torch.quantile's p (S - 1)
    position covers less: 89 % for "95 %" at S = 32); clamped to the extreme samples."""
    n = ordered.shape[0]
    h = min(max(p * (n + 1) - 1, 0.0), n - 1.0)  # 0-based fractional rank
    lo = int(math.floor(h))
    hi, frac = min(lo + 1, n - 1), h - lo
    return ordered[lo] + frac * (ordered[hi] - ordered[lo])


def native_report(pred: Predictive, y: Tensor) -> dict[str, float]:
    """The study's metrics of a sampled predictive against y (N, D), all in standardised target units."""
    s, y = pred.samples.double(), y.double()
    pit = empirical_pit(s, y)
    err = pred.point.double() - y
    var = s.var(0, unbiased=False)
    report = {
        "n": int(y.numel()),
        "nrmse": err.pow(2).mean().sqrt().item(),
        "mse": err.pow(2).mean().item(),
        "mae": err.abs().mean().item(),
        "nll": metrics.gaussian_nll(s.mean(0), var.clamp_min(STD_FLOOR**2), y),
        "crps": metrics.crps_ensemble(s, y),
        "pit_w1": metrics.pit_wasserstein(pit),
        "ece": float(np.mean([abs(np.mean(pit <= p) - p) for p in metrics.ECE_LEVELS])),
    }
    report["rmse"] = report["nrmse"]
    ordered = s.sort(0).values
    for level in INTERVALS:
        lower, upper = (sample_quantile(ordered, p) for p in ((1 - level) / 2, (1 + level) / 2))  # (N, D) each
        report[f"coverage_{round(level * 100)}"] = calibration.coverage_of(lower, upper, y).item()
        report[f"width_{round(level * 100)}"] = calibration.mean_width(lower, upper).item()
    report.update(metrics.decomposition(torch.zeros_like(var), var))
    return report


def conformal_curve(
    cal: Predictive, y_cal: Tensor, test: Predictive, y_test: Tensor, levels: tuple[float, ...] = CURVE_LEVELS
) -> dict[str, list[float]]:
    """Split-conformal intervals point +- q std at each target level: test coverage, mean width, the scale."""
    c, t = (cal.point, cal.std(), y_cal), (test.point, test.std(), y_test)
    rows = [calibration.width_at_coverage(c, t, level) for level in levels]
    return {
        "levels": list(levels),
        "coverage": [r.coverage.item() for r in rows],
        "width": [r.width.item() for r in rows],
        "scale": [r.scale.item() for r in rows],
    }


def width_at(curve: dict[str, list[float]], coverage: float) -> float:
    """A conformal curve's width at a test coverage (linear between its points; nan outside their range)."""
    cov, width = np.asarray(curve["coverage"]), np.asarray(curve["width"])
    finite = np.isfinite(width)
    cov, width = cov[finite], width[finite]
    order = np.argsort(cov, kind="stable")
    cov, width = cov[order], width[order]
    if cov.size == 0 or not cov[0] <= coverage <= cov[-1]:
        return math.nan
    return float(np.interp(coverage, cov, width))


def study_report(cal: Predictive, y_cal: Tensor, test: Predictive, y_test: Tensor) -> dict[str, Any]:
    """Native report on test, then temperature scaling and split conformal fitted on the calibration part."""
    temperature = calibration.fit_temperature(cal.point, cal.std(), y_cal).item()
    scaled = Predictive(test.point + temperature * (test.samples - test.point), test.point)  # T = 1: native
    curve = conformal_curve(cal, y_cal, test, y_test)
    at95 = curve["levels"].index(0.95)
    return {
        "native": native_report(test, y_test),
        "temperature": {"T": temperature, **native_report(scaled, y_test)},
        "conformal_95": {
            "coverage": curve["coverage"][at95],
            "width": curve["width"][at95],
            "scale": curve["scale"][at95],
        },
        "curve": curve,
        "pit": empirical_pit(test.samples, y_test),
        "pit_temperature": empirical_pit(scaled.samples, y_test),
    }


# -- sampling ------------------------------------------------------------------------------------------------------
def chunked(forward: Forward, batch: int) -> Forward:
    """forward applied to row chunks of at most `batch` inputs (bounds memory for M- or S-fold stacks)."""

    def run(model: nn.Module, x: Tensor) -> Tensor:
        return torch.cat([forward(model, x[i : i + batch]) for i in range(0, len(x), batch)])

    return run


def standardised_point(model: nn.Module, x: Tensor) -> Tensor:
    """A controller's single-pass mean in standardised target units, (B, D): the f(x) SA perturbs."""
    return (model.moments(x, 1)[0][0] - model.y_loc) / model.y_scale


@torch.no_grad()
def sa_sample(
    model: nn.Module, x: Tensor, nu: int, samples: int, seed: int, forward: Forward, batch: int
) -> Predictive:
    """S passes with SA at nu, centred on the deterministic output (chunks of `batch` inputs x S passes)."""
    generator = torch.Generator().manual_seed(seed)
    step = max(1, batch // samples)
    parts = [sa_samples(model, x[i : i + step], nu, samples, generator, forward) for i in range(0, len(x), step)]
    return Predictive(torch.cat(parts, 1), chunked(forward, batch)(model, x))  # (S, N, D), (N, D)


@torch.no_grad()
def sa_predictive(
    model: nn.Module,
    x_cal: Tensor,
    y_cal: Tensor,
    x_test: Tensor,
    *,
    samples: int,
    passes: int,
    seed: int,
    forward: Forward = standardised_point,
    batch: int = 4096,
    compare: bool = True,
) -> tuple[Predictive, Predictive, dict[str, Any]]:
    """nu by the default BO on (x_cal, y_cal) (standardised y); SA's predictive on both parts; the search record."""
    model.eval()
    fwd = chunked(forward, batch)
    found = calibrate_nu(model, x_cal, y_cal, forward=fwd, n_passes=passes, seed=seed)
    record: dict[str, Any] = {
        "nu": found.nu,
        "routine": "default",
        "wall_time_s": found.wall_time_s,
        "n_evals": found.n_evals,
        "converged": found.converged,
        "at_bound": found.at_bound,
        "nu_bounds": list(found.nu_bounds),
        "n_extensions": found.n_extensions,
        "curve": found.curve,
        "target_dispersion": found.target_dispersion,
    }
    if compare:
        record["comparison"] = compare_routines(model, x_cal, y_cal, found.nu, passes, seed, fwd)
    t0 = time.perf_counter()
    cal = sa_sample(model, x_cal, found.nu, samples, seed + 1, forward, batch)
    test = sa_sample(model, x_test, found.nu, samples, seed + 2, forward, batch)
    record["sampling_s"] = time.perf_counter() - t0
    return cal, test, record


def compare_routines(model, x, y, nu_default: int, passes: int, seed: int, forward: Forward) -> dict[str, Any]:
    """The published routine's nu and a grid's, with L_SA of every choice on the whole part (same draws)."""
    grid = grid_search_nu(model, x, y, list(GRID), passes, seed, forward)
    best = min(grid, key=lambda e: e.loss)

    def loss(nu: int) -> float:
        return sa_evaluate(model, x, y, nu, passes, seed, forward).loss

    try:
        found = calibrate_nu(model, x, y, forward=forward, n_passes=passes, seed=seed, routine="published")
        published = {
            "nu": found.nu,
            "loss": loss(found.nu),
            "wall_time_s": found.wall_time_s,
            "n_evals": found.n_evals,
            "at_bound": found.at_bound,
        }
    except (OverflowError, np.linalg.LinAlgError) as exc:  # agents/sa_published.py on exact-zero deviations
        published = {"nu": None, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "default": {"nu": nu_default, "loss": loss(nu_default)},
        "published": published,
        "grid": {
            "nu": best.nu,
            "loss": best.loss,
            "nus": [e.nu for e in grid],
            "losses": [e.loss for e in grid],
            "dispersions": [e.dispersion for e in grid],
        },
    }


@torch.no_grad()
def own_samples(model: nn.Module, x: Tensor, samples: int, seed: int, batch: int = 4096) -> Predictive:
    """A baseline's own predictive: `moments(x, S)` means (var is 0 for the study's point predictors), standardised."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    step = max(1, batch // samples)
    parts = [model.moments(x[i : i + step], samples, generator)[0] for i in range(0, len(x), step)]  # (S, b, D)
    return from_samples((torch.cat(parts, 1) - model.y_loc) / model.y_scale)


# -- what a run writes --------------------------------------------------------------------------------------------
def study_result(method: str, p_cal, y_cal, p_test, y_test, cost: dict, search: dict | None) -> dict:
    """metrics.json's part of one method: "test" (native), "study" (post hoc, cost, search); arrays kept apart."""
    report = study_report(p_cal, y_cal, p_test, y_test)
    arrays = {f"{method}_pit": report.pop("pit"), f"{method}_pit_temperature": report.pop("pit_temperature")}
    study = {"method": method, **report, "cost": cost, "units": "standardised by the training targets' std"}
    if search is not None:
        study["sa"] = search
    return {"test": report["native"], "study": study, "arrays": arrays}


def save_arrays(arrays: dict, run_dir: Path) -> list[Path]:
    """RUN/sa_study.npz: the test PIT values for pooled histograms (not a plot: the report draws them)."""
    if arrays:
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        atomic_write(run_dir / "sa_study.npz", buf.getvalue())
    return []
