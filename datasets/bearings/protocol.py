"""The NSAC fourth-experiment splits over the feature tables (the protocol itself is described in `table.py`)."""

from __future__ import annotations

import math
import os
from typing import Literal, NamedTuple

import numpy as np

from datasets.scaling import Scaler

from .table import PAPER_TESTS, TRAIN, VAL_FRACTION, FeatureTable, input_names, read_feature_csv, staged_files


class Standardiser(Scaler):
    """sklearn StandardScaler semantics on the shared `datasets.scaling.Scaler` ("standard": (x - mean) / std,
    ddof 0; scale 1 for a constant column, which maps to 0). `mean` is the offset.

    Before it was shared, this class used sklearn's `_is_constant_feature` bound for constant columns and kept
    their mean as offset; measured on all 23 staged feature files (training set and each bearing alone, with and
    without Time), both rules flag the same single column and the transforms agree to 1.5e-10."""

    @classmethod
    def fit(cls, x: np.ndarray) -> Standardiser:  # type: ignore[override]
        fitted = Scaler.fit("standard", x)
        return cls(fitted.kind, fitted.offset, fitted.scale)

    @property
    def mean(self) -> np.ndarray:
        return self.offset


class TestBearing(NamedTuple):
    x: np.ndarray  # (N, D) standardised inputs
    y: np.ndarray  # (N,) degradation label
    time: np.ndarray  # (N,) the raw Time column, for plotting trajectories


class BearingSplit(NamedTuple):
    x_train: np.ndarray  # (n_train, D) standardised
    y_train: np.ndarray  # (n_train,)
    x_val: np.ndarray  # (n_val, D): the 10% held out of the training bearings (NSAC's X_test)
    y_val: np.ndarray  # (n_val,)
    tests: dict[str, TestBearing]  # PAPER_TESTS first, then every other staged bearing not trained on
    feature_names: tuple[str, ...]  # (D,)
    scaler: Standardiser  # fitted on all rows of the training bearings


def train_val_indices(n: int, seed: int, val_fraction: float = VAL_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) row indices identical to sklearn `train_test_split(range(n), test_size=val_fraction,
    random_state=seed)` (checked against scikit-learn 1.x for n = 10, 17, 28000)."""
    permutation = np.random.RandomState(seed).permutation(n)
    n_val = math.ceil(val_fraction * n)
    return permutation[n_val:], permutation[:n_val]


def nsac_split(
    seed: int = 42,
    *,
    include_time: bool = True,
    test_scaling: Literal["train", "per_bearing"] = "train",
    data_root: str | os.PathLike | None = None,
    tables: dict[str, FeatureTable] | None = None,
) -> BearingSplit:
    """The train / validation / test bearings of one NSAC run (seeds 42..46 in the paper).

    include_time: Time among the inputs (16 features) or not (15); test_scaling: "train" applies the training
    standardiser to test bearings, "per_bearing" refits it on each test bearing as NSAC's rul_test.py does;
    tables: already read tables by name (default: every staged file under the data root)."""
    if tables is None:
        tables = {name: read_feature_csv(path, name) for name, path in staged_files(data_root).items()}
    missing = [name for name in (*TRAIN, *PAPER_TESTS) if name not in tables]
    if missing:
        raise FileNotFoundError(f"feature files missing for {missing} (see bearings/PROVENANCE.md)")
    x_all = np.concatenate([tables[name].inputs(include_time) for name in TRAIN])  # (n, D)
    y_all = np.concatenate([tables[name].label for name in TRAIN])  # (n,)
    scaler = Standardiser.fit(x_all)
    train, val = train_val_indices(len(x_all), seed)
    x_all = scaler.transform(x_all)
    tests = {}
    for name in (*PAPER_TESTS, *sorted(set(tables) - set(TRAIN) - set(PAPER_TESTS))):
        x = tables[name].inputs(include_time)
        x = Standardiser.fit(x).transform(x) if test_scaling == "per_bearing" else scaler.transform(x)
        tests[name] = TestBearing(x, tables[name].label, tables[name].time)
    return BearingSplit(x_all[train], y_all[train], x_all[val], y_all[val], tests, input_names(include_time), scaler)
