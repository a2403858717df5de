"""Scoring helpers the offline task plugins share: one predictive scored in several units, point-forecast references.

A task trained in scaled units (a `datasets.scaling.Scaler` fitted on its training rows) reports the same
predictive in the units a protocol scores in: the mean goes through `inverse_transform`, the variances through
`inverse_var` (x scale^2), so MSE scales by scale^2, CRPS and widths by scale, NLL shifts by log(scale), and the
unit-free metrics (ECE, PIT-W1, coverage) are unchanged. A reference forecast without a predictive distribution
(last value, seasonal naive) is a point mass: its CRPS equals its MAE; its NLL is undefined and not reported.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from agents.base import Prediction
from drive import metrics


def rescaled(pred: Prediction, y: Any, offset: Any, scale: Any) -> tuple[Prediction, torch.Tensor]:
    """Prediction and targets after v -> v * scale + offset (per output column, broadcast)."""
    offset = torch.as_tensor(np.asarray(offset), dtype=torch.float64)
    scale = torch.as_tensor(np.asarray(scale), dtype=torch.float64)
    mean = pred.mean.double() * scale + offset
    out = Prediction(mean, pred.aleatoric_var.double() * scale**2, pred.epistemic_var.double() * scale**2)
    return out, torch.as_tensor(y).double() * scale + offset


def point_report(forecast: Any, y: Any) -> dict[str, float]:
    """A point forecast's scores: mse, mae, rmse and crps (= mae: the CRPS of a point mass)."""
    forecast, y = np.asarray(forecast, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return {
        "mse": metrics.mse(forecast, y),
        "mae": metrics.mae(forecast, y),
        "rmse": metrics.rmse(forecast, y),
        "crps": metrics.mae(forecast, y),
    }


def constant_gaussian_report(loc: float, scale: float, y: Any) -> dict[str, float]:
    """The train-mean predictor with the training spread: N(loc, scale^2) for every test row, fully scored."""
    y = torch.as_tensor(np.asarray(y, dtype=np.float64))
    var = torch.full_like(y, float(scale) ** 2)
    keys = ("mse", "mae", "rmse", "nll", "crps", "ece", "pit_w1", "coverage_90", "width_90")
    report = metrics.regression_report(Prediction(torch.full_like(y, float(loc)), var, torch.zeros_like(y)), y)
    return {k: report[k] for k in keys}
