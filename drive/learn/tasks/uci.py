"""Task "uci": the nine UCI regression sets, Gal's protocol or the NSAC paper's (`drive train --task uci`).

    drive train --task uci --controller nsac --seed 0 --out runs/uci-boston --set task.dataset=boston task.protocol=gal

Data: `uci_gal/` under the data root (`--data ROOT` or the default root), read by `datasets/uci.py`, whose docstring
documents the files, the splits and the scaling. Run seed s is the protocol's split: `gal` split index s (0..19, 0..4
for protein), `nsac` run s = split seed 42 + s (the paper's seeds 42-46 are runs 0-4). The seed also seeds the
model's initialisation and batch order.

Input encoding: the scaled feature vector, one token per feature (EncoderConfig kind "features"), the same backbone
for every controller. Target: the scaled target, (1,). Early stopping on the validation part the loader cuts from
the training rows (gal: the last 20 % in file order; nsac: the last 10 %, as Keras' validation_split).

Metrics (metrics.json; drive.metrics.regression_report keys):
- "test": the protocol's own units. gal: the target's original units (mean -> y_scaler.inverse_transform,
  variances x scale^2), the units the UQ literature (Gal 2016, Lakshminarayanan 2017) reports RMSE and NLL in.
  nsac: MinMax-scaled units, the paper text's protocol.
- "tests": the same predictive in the other units ("scaled" for gal, "original" for nsac) and, for nsac, in the
  authors' units y / max(y) of the whole set (their scripts' scaling; datasets/uci.py), where the paper's numbers live.
- every report carries "references": {"train_mean": the constant predictor N(mean, var) of the fit rows' targets},
  the level at which the paper's UCI numbers sit (datasets/uci.py measured it in the authors' units).

Departures: x of the nsac protocol is MinMax-scaled as the paper's text says (the authors' scripts StandardScale x),
so our MinMax-unit MSEs are (max / (max - min))^2 of y above y / max(y) units (boston 1.23, kin8nm 1.06); the
"authors" units report removes that factor for y. PAPER's gal numbers are the deep-ensemble figures
(Lakshminarayanan et al. 2017, Table 1: RMSE / NLL, original units), not the NSAC paper's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch

from agents.checks import at_least, label
from agents.encoders import EncoderConfig
from datasets import uci
from drive import metrics
from drive.errors import UserError
from drive.learn.batches import predict_dataset
from drive.learn.tasks import TaskData
from drive.learn.tasks.scoring import constant_gaussian_report, rescaled

DATA = "ROOT: the data root holding uci_gal/ (default: $DRIVE_DATA_ROOT or ../shared/data)"
DATASETS = uci.UCI_NAMES
PROTOCOLS = uci.PROTOCOLS
CONTROLLERS = ("nsac", "gmle", "mcd", "de", "der", "sdenet")
DEFAULT_SEEDS = {"gal": 3, "nsac": 5}  # a first gal table in ~30 min per set; the full protocol: --seeds 20
REPORT_PLOTS = ("reliability", "pit")
PAPER_SOURCES = {
    "nsac": "NSAC paper, regression experiment (text; MinMax-scaled units, seeds 42-46)",
    "gal": "deep ensembles (Lakshminarayanan et al. 2017, Table 1), Gal's 20 splits, original units",
}
_DE = {"boston": (3.28, 2.41), "concrete": (6.03, 3.06), "energy": (2.09, 1.38), "kin8nm": (0.09, -1.20),
       "naval": (0.00, -5.63), "power": (4.11, 2.79), "protein": (4.71, 2.83), "wine": (0.64, 0.94),
       "yacht": (1.58, 1.18)}  # fmt: skip
PAPER: dict = {
    "gal": {name: {"de": {"rmse": rmse, "nll": nll}} for name, (rmse, nll) in _DE.items()},
    "nsac": {
        "boston": {
            "nsac": {"mse": 0.030, "nll": -0.2665, "crps": 0.0940, "ece": 0.3974},
            "de": {"mse": 0.0303, "nll": -0.2633, "crps": 0.0945, "ece": 0.4012},
            "gmle": {"mse": 0.0304},
            "mcd": {"mse": 0.0418, "nll": -0.2618},
            "sdenet": {"mse": 0.0348, "ece": 0.0632},
            "der": {"crps": 0.211, "ece": 0.1208},
        },
        "kin8nm": {
            "nsac": {"mse": 0.0327, "nll": -0.3870, "crps": 0.1029, "ece": 0.3085},
            "gmle": {"nll": -0.3893},
            "de": {"nll": -0.3905},
            "mcd": {"nll": -0.3889},
            "der": {"nll": -0.3878},
        },
    },
}
# the paper's numbers also beside the authors' units (their scripts' y / max y), where they most plausibly live
PAPER["nsac"].update({f"{name}/authors (y / max y)": rows for name, rows in list(PAPER["nsac"].items())})


@dataclass(frozen=True)
class Options:
    LABEL: ClassVar[str] = "task"  # errors name fields as `--set task.KEY` does

    dataset: str = "boston"
    """UCI set: boston, concrete, energy, kin8nm, naval, power, protein, wine, yacht"""
    protocol: Literal["gal", "nsac"] = "gal"
    """gal: Gal's index files, standardised, original units; nsac: the NSAC paper's 90/10 MinMax protocol"""
    val_fraction: float = -1.0
    """share of the training rows held out for early stopping (< 0: the protocol's, gal 0.2, nsac 0.1)"""
    eval_samples: int = 0
    """stochastic samples per test prediction (0: the controller's default)"""

    def __post_init__(self) -> None:
        at_least(self, 0, "eval_samples")
        if self.val_fraction >= 0 and not 0 < self.val_fraction < 1:  # < 0: the protocol's share
            raise ValueError(
                f"{label(self)}.val_fraction={self.val_fraction} must be in (0, 1), or < 0 (the protocol's)"
            )


def n_runs(dataset: str, protocol: str, root: Path | None = None) -> int:
    """How many runs the protocol has for `dataset` (gal: its split files; nsac: 5)."""
    return uci.n_splits(uci.load_uci(dataset, root), protocol)


def build(opts: Options, data: Path | None, seed: int) -> TaskData:
    if opts.dataset not in DATASETS:
        raise UserError(f"task 'uci': unknown dataset {opts.dataset!r}; choose from {', '.join(DATASETS)}")
    try:
        table = uci.load_uci(opts.dataset, data)
        count = uci.n_splits(table, opts.protocol)
    except FileNotFoundError as exc:
        raise UserError(f"task 'uci': {exc}") from None
    if not 0 <= seed < count:
        raise UserError(
            f"task 'uci': --seed {seed} is outside the {opts.protocol} runs of {opts.dataset} (0..{count - 1})"
        )
    part = uci.split(table, opts.protocol, seed, None if opts.val_fraction < 0 else opts.val_fraction)

    def tensors(x: np.ndarray, y: np.ndarray) -> torch.utils.data.TensorDataset:
        return torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y).unsqueeze(1))  # (N, F), (N, 1)

    test = tensors(part.x_test, part.y_test)
    y_all_max = float(np.max(table.y))

    def evaluate(model) -> dict:
        return evaluate_uci(model, test, part, y_all_max, opts.eval_samples, seed)

    return TaskData(
        name="uci",
        train=tensors(part.x_train, part.y_train),
        val=tensors(part.x_val, part.y_val),
        test=test,
        encoder=EncoderConfig(kind="features", in_dim=part.x_train.shape[1], d_model=32),
        out_dim=1,
        target_names=(table.target_name,),
        fingerprint={
            "dataset": opts.dataset,
            "protocol": opts.protocol,
            "split_index": seed,
            "split_seed": part.seed,
            "data_path": None if data is None else str(data),
            "source": str(table.folder),
            "n_train": len(part.train_rows),
            "n_val": len(part.val_rows),
            "n_test": len(part.test_rows),
        },
        evaluate=evaluate,
        standardiser={
            "x_offset": part.x_scaler.offset.tolist(),
            "x_scale": part.x_scaler.scale.tolist(),
            "y_offset": float(part.y_scaler.offset),
            "y_scale": float(part.y_scaler.scale),
            "kind": part.x_scaler.kind,
        },
        controller_defaults={"encoder.d_model": 32, "n_heads": 4},
        train_defaults={
            "epochs": 40,
            "batch_size": 32 if len(part.train_rows) < 1000 else 128,
            "lr": 1e-3,
            "patience": 10,
        },
    )


@torch.no_grad()
def evaluate_uci(model, test, part: uci.RegressionSplit, y_all_max: float, samples: int, seed: int) -> dict:
    pred, y = predict_dataset(model, test, 1024, samples or None, seed)  # (N, 1) scaled units
    ys = part.y_scaler
    units = {"scaled": (0.0, 1.0), "original": (ys.offset, ys.scale)}
    if part.protocol == "nsac":  # the authors' y / max(y) of the whole set
        units["authors (y / max y)"] = (ys.offset / y_all_max, ys.scale / y_all_max)
    fit_y = part.y_train.astype(np.float64)  # scaled training targets (the fit rows)
    reports = {}
    for name, (offset, scale) in units.items():
        p, t = rescaled(pred, y, offset, scale)
        report = metrics.regression_report(p, t)
        ref_loc, ref_scale = fit_y.mean() * scale + offset, fit_y.std() * scale
        report["references"] = {"train_mean": constant_gaussian_report(ref_loc, ref_scale, t.numpy())}
        reports[name] = {**report, "units": name}
    head = "original" if part.protocol == "gal" else "scaled"
    return {
        "test": reports.pop(head),
        "tests": reports,
        "split": {"protocol": part.protocol, "index": part.index, "seed": part.seed},
    }
