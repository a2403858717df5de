"""Forecasting series (ETT-small, Jena climate): windows, the three split protocols, naive reference forecasts.

Sources (under the data root; each folder's PROVENANCE.md)
- `ett/ETT{h1,h2,m1,m2}.csv.gz`: zhouhaoyi/ETDataset @ 1d16c8f `ETT-small/*.csv`, gzipped, byte-identical to the
  release. Header `date,HUFL,HULL,MUFL,MULL,LUFL,LULL,OT`, date `YYYY-MM-DD HH:MM:SS`; ETTh 17,420 rows at 1 h,
  ETTm 69,680 rows at 15 min; no gaps, no missing values. Target OT (oil temperature), already the last column.
- `jena_climate/weather_2020_mpi_bgc_jena.csv.gz`: the LTSF "Weather" file = the MPI-BGC Jena roof station in YEAR
  2020, a stand-in for the Keras jena_climate_2009_2016.csv the paper used (not obtainable). `date` + 21 channels;
  we keep the 14 classic Jena variables (JENA_COLUMNS, the 2009-2016 file's names and order) and move the target
  `T (degC)` last, as the authors' scripts do. SeriesData.year = 2020 so every result can flag the substitution.
Layout: SeriesData.values (T, C) in original units with the target LAST, so the target is column -1 everywhere.

Jena quirks (all inside the first 25,000 rows the paper uses) and their handling
- -9999 sentinel: `wv (m/s)` once (2020-02-20 07:40, file line 7247); replaced by linear interpolation in time
  between the column's neighbours (the 2009-2016 file has the same sentinel; same rule). Left in, it would squash
  MinMax-scaled wv into ~1.
- duplicated timestamp 2020-05-12 06:00:00 (lines 19045-19046, identical rows): the second is dropped (differing
  duplicates raise).
- one gap, 2020-05-29 09:30 -> 11:10 (9 missing 10-min steps, in the paper's validation rows): filled by linear
  interpolation so that the grid is regular (a look-back is 48 x 10 min, a day 144 rows). Gaps over MAX_FILL steps
  raise. SeriesData.imputed marks the 10 interpolated rows. After this 52,704 rows; the first 25,000 rows end
  2020-06-22 14:40 (16:00 in the raw file). The issue's naive-reference figures hold either way (checked).

Windows: a window with first target row t has the look-back rows [t - L, t) of all C scaled columns -> x (L, C)
and the target rows [t, t + H) of the target -> y (H,); Windows.t holds t. x is a read-only strided view.

Protocols (split_series); `*_rows` of a ForecastSplit are half-open row ranges
- `paper` (the NSAC paper's forecasting experiment; authors' LRM_exps/forecast_ettm1.py, forecast_weather.py @
  10caa3e): first 25,000 rows, chronological 80/10/10 = [0, 20000) / [20000, 22500) / [22500, 25000); MinMax on train;
  windows built inside each split (the authors' create_windows on each scaled part), so val / test look-backs do
  NOT start in the previous split; n - L - H windows per split (their `range(len - L - H)` drops the last possible
  window; kept). Scored in scaled units and, after target_scaler.inverse_transform, in original units.
- `authors` (LRM_exps/ETTm1_random.py; weather_random.py for Jena): first 15,000 rows, train [0, 13500) / test
  [13500, 15000), windows inside each part, test look-backs start in the test rows; validation = the last
  ceil(10 %) of the train windows in time order (`train_test_split(test_size=0.1, shuffle=False)`): 1,343 of
  13,428 at L 48, H 24. The runs' seeds 42-46 change NO data: with shuffle=False sklearn ignores random_state,
  they only reseed numpy / TensorFlow (model init), so all five runs see these same splits (AUTHORS_SEEDS).
  Because validation is cut from the window list, the last L + H - 1 (71) training windows have target steps in
  the validation windows' rows (val_rows starts at the first validation look-back): kept for fidelity; only early
  stopping sees it. Scaler: MinMax for ETT (ETTm1_random.py) but StandardScaler for Jena (weather_random.py),
  although the paper text says MinMaxScaler for both. Scored in scaled units.
- `informer` (Zhou et al. 2021, the Informer / Autoformer ETT loaders; ETT only): months of 30 days, train 12 /
  val 4 / test 4 months = ETTh [0, 8640) / [8640, 11520) / [11520, 14400), ETTm x4; StandardScaler on the train
  rows; each split's targets lie in its rows and its look-back MAY start in the previous split (border1 = start -
  seq_len), giving n - H + 1 val / test windows (train n - L - H + 1); the remaining tail rows are unused.

Naive references (naive_forecasts), from the scaled target series itself (affine scaling commutes with them):
last value y[t - 1] repeated; one-day seasonal naive y[t + h - P * (h // P + 1)] (P = 96 at 15 min, 24 at 1 h,
144 at 10 min; never a future step); the train-rows mean. `history_start` is the first row the seasonal naive may
read (default 0: the whole series before t, not only the look-back); a window with less than one period of
history from there gets the last value instead. Measured, paper protocol, test split, scaled units, all 24 steps:
ETTm1 OT last value 0.0012, seasonal 0.0042 (full history) / 0.0034 (history_start = test start: the first 48
windows fall back to the last value; this is how the issue's figure was measured), train mean 0.047; Jena 2020 T:
last value 0.0043 (3.72 degC^2), seasonal 0.0131 / 0.0129 (the issue's; 96 windows fall back).

The paper's Jena row (NSAC MSE 0.1675, NLL -1.9114, CRPS 0.1422) against references measured on the 2020 file:
- paper protocol, MinMax: last value 0.0043, train mean 0.135, so 0.1675 would lose to a constant; in degC^2:
  last value 3.72, so 0.1675 would beat persistence 22x at 4 h. Neither is plausible, as the issue says.
- StandardScaler units fit: the authors' own weather_random.py (the 5-seed script, the same layout as the table)
  uses StandardScaler, the first 15,000 rows, 90/10, scored in scaled units. There the 2020 references are last
  value 0.68, seasonal 1.30, train mean 3.90: the baselines' 0.65-1.70 sit at 1-2.5x persistence, NSAC at 0.25x.
  With StandardScaler on the paper protocol's rows, last value is 0.129: NSAC 1.3x, baselines 5-13x persistence,
  the ETTm1 pattern (every method 3-8x persistence). MinMax MSE summed over the 24 steps (last value 0.102)
  would fit the MSE alone.
- The three numbers cannot come from one Gaussian per point in one unit: a calibrated Gaussian with MSE 0.1675 has
  NLL 0.53 and CRPS 0.23; NLL -1.91 needs variances ~0.0013 (sigma 0.036) and errors that small. In the authors'
  code NLL is the NSAC training loss (MC passes, var + 1e-3), MSE a separate deterministic pass, and one version
  of comprehensive_evaluate returns the grand MEANS of mu and sigma, so CRPS scores a single constant Gaussian
  (the best one on the 2020 authors-protocol test targets scores 0.141 MinMax, 0.82 StandardScaler).
Reading: the MSE is most plausibly in StandardScaler units (weather_random.py) on the 2009 file, whose test rows
(~4-15 April 2009) cannot be checked here; NLL and CRPS are not on the same footing and should not be compared.
"""

from __future__ import annotations

import csv
import gzip
import math
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from datasets.errors import DataError
from datasets.root import data_folder
from datasets.scaling import Scaler

ETT_FILES = {"etth1": "ETTh1.csv.gz", "etth2": "ETTh2.csv.gz", "ettm1": "ETTm1.csv.gz", "ettm2": "ETTm2.csv.gz"}
ETT_COLUMNS = ("HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT")
JENA_FILE = "weather_2020_mpi_bgc_jena.csv.gz"
JENA_COLUMNS = (
    "p (mbar)", "T (degC)", "Tpot (K)", "Tdew (degC)", "rh (%)", "VPmax (mbar)", "VPact (mbar)", "VPdef (mbar)",
    "sh (g/kg)", "H2OC (mmol/mol)", "rho (g/m**3)", "wv (m/s)", "max. wv (m/s)", "wd (deg)",
)  # fmt: skip
JENA_TARGET = "T (degC)"
JENA_YEAR = 2020
SENTINEL = -9999.0
MAX_FILL = 12  # longest gap (missing steps) filled by interpolation
SERIES_NAMES = (*ETT_FILES, "jena")
PROTOCOLS = ("paper", "authors", "informer")
AUTHORS_SEEDS = (42, 43, 44, 45, 46)
LOOKBACK, HORIZON = 48, 24


class ForecastFormatError(DataError):
    """A series file that does not have the documented layout; the message names the file and line."""


class SeriesData(NamedTuple):
    name: str
    values: np.ndarray  # (T, C) float64, original units, target last
    columns: tuple[str, ...]  # (C,)
    times: np.ndarray  # (T,) datetime64[s], a regular grid
    step_s: int  # seconds between rows
    period: int  # rows per day: the seasonal-naive period
    imputed: np.ndarray  # (T, C) bool, True where a value was interpolated (Jena sentinel / gap)
    year: int | None  # Jena: 2020 (stand-in for 2009-2016); None for ETT (the canonical files)
    source: Path


class Windows(NamedTuple):
    x: np.ndarray  # (N, L, C) float32 scaled look-backs, a read-only view into ForecastSplit.scaled
    y: np.ndarray  # (N, H) float32 scaled target steps
    t: np.ndarray  # (N,) int64 row of each window's first target step


class ForecastSplit(NamedTuple):
    name: str
    protocol: str
    lookback: int
    horizon: int
    period: int
    train: Windows
    val: Windows
    test: Windows
    train_rows: tuple[int, int]  # rows the scaler is fitted on
    val_rows: tuple[int, int]  # authors: from the first validation look-back (overlaps train_rows)
    test_rows: tuple[int, int]
    scaled: np.ndarray  # (n_rows, C) float32, the protocol's rows [0, n_rows) scaled
    scaler: Scaler  # all C columns, fitted on train_rows
    target_scaler: Scaler  # the target column's part of `scaler`
    year: int | None


class NaiveForecasts(NamedTuple):
    last_value: np.ndarray  # (N, H) float64, scaled units
    seasonal: np.ndarray  # (N, H) float64
    train_mean: np.ndarray  # (N, H) float64


def load_series(name: str, root: str | os.PathLike | None = None) -> SeriesData:
    """One series by name (SERIES_NAMES: etth1, etth2, ettm1, ettm2, jena) from under the data root."""
    if name in ETT_FILES:
        path = data_folder("ett", root) / ETT_FILES[name]
        times, values = _read_csv(path, ETT_COLUMNS)
        step = _regular_step(path, times)
        imputed = np.zeros(values.shape, dtype=bool)
        return SeriesData(name, values, ETT_COLUMNS, times, step, 86400 // step, imputed, None, path)
    if name != "jena":
        raise ValueError(f"unknown series {name!r}; choose from {', '.join(SERIES_NAMES)}")
    path = data_folder("jena_climate", root) / JENA_FILE
    times, values, imputed = _clean_jena(path, *_read_csv(path, JENA_COLUMNS))
    order = [c for c in range(len(JENA_COLUMNS)) if JENA_COLUMNS[c] != JENA_TARGET] + [JENA_COLUMNS.index(JENA_TARGET)]
    columns = tuple(JENA_COLUMNS[c] for c in order)
    return SeriesData("jena", values[:, order], columns, times, 600, 144, imputed[:, order], JENA_YEAR, path)


def split_series(
    data: SeriesData, protocol: str = "paper", lookback: int = LOOKBACK, horizon: int = HORIZON
) -> ForecastSplit:
    """Scaled windows of `protocol` (module docstring) with look-back L and horizon H."""
    L, H = lookback, horizon
    if protocol == "paper":
        n = _rows_needed(data, 25_000)
        a, b = int(0.8 * n), int(0.9 * n)
        rows, kind = ((0, a), (a, b), (b, n)), "minmax"
        targets = [(s + L, e - H) for s, e in rows]
    elif protocol == "authors":
        n = _rows_needed(data, 15_000)
        a = int(0.9 * n)
        n_val = math.ceil(0.1 * (a - L - H))  # of the train windows, as train_test_split(test_size=0.1)
        t_val = a - H - n_val
        rows = ((0, a), (t_val - L, a), (a, n))
        kind = "standard" if data.name == "jena" else "minmax"
        targets = [(L, t_val), (t_val, a - H), (a + L, n - H)]
    elif protocol == "informer":
        if data.name not in ETT_FILES:
            raise ValueError(f"the informer protocol is defined for ETT only, not {data.name}")
        month = 30 * data.period
        rows, kind = ((0, 12 * month), (12 * month, 16 * month), (16 * month, 20 * month)), "standard"
        targets = [(L, 12 * month - H + 1), (12 * month, 16 * month - H + 1), (16 * month, 20 * month - H + 1)]
        n = _rows_needed(data, 20 * month)
    else:
        raise ValueError(f"unknown protocol {protocol!r}; choose from {', '.join(PROTOCOLS)}")
    if min(stop - start for start, stop in targets) < 1:
        raise ValueError(f"{data.name} {protocol}: look-back {L} + horizon {H} leave a split without windows")
    scaler = Scaler.fit(kind, data.values[slice(*rows[0])])
    scaled = scaler.transform(data.values[:n]).astype(np.float32)  # (n, C)
    looks = sliding_window_view(scaled, L, axis=0).transpose(0, 2, 1)  # (n - L + 1, L, C), [k] = rows [k, k + L)
    steps = sliding_window_view(scaled[:, -1], H)  # (n - H + 1, H), [k] = target rows [k, k + H)
    train, val, test = (
        Windows(looks[t0 - L : t1 - L], np.ascontiguousarray(steps[t0:t1]), np.arange(t0, t1)) for t0, t1 in targets
    )
    return ForecastSplit(
        data.name, protocol, L, H, data.period, train, val, test, *rows, scaled, scaler, scaler.column(-1), data.year
    )


def last_value(series: np.ndarray, t: np.ndarray, horizon: int) -> np.ndarray:
    """The last observed value y[t - 1] for every step: (N, H)."""
    return np.repeat(series[t - 1][:, None], horizon, axis=1)


def seasonal_naive(series: np.ndarray, t: np.ndarray, horizon: int, period: int, history_start: int = 0) -> np.ndarray:
    """y[t + h - P (h // P + 1)]: the same phase one period back (further for h >= P): (N, H).

    Windows with t - period < history_start (under one period of history) get the last value instead.
    """
    h = np.arange(horizon)
    rows = t[:, None] + (h - period * (h // period + 1))[None, :]  # (N, H), every row < t
    short = (t - period < history_start)[:, None]  # (N, 1)
    return series[np.where(short, t[:, None] - 1, rows)]


def naive_forecasts(split: ForecastSplit, windows: Windows, history_start: int = 0) -> NaiveForecasts:
    """Last value, one-day seasonal naive and train mean for `windows` of `split`, in scaled units."""
    series = split.scaled[:, -1].astype(np.float64)  # (n_rows,)
    last = last_value(series, windows.t, split.horizon)
    seasonal = seasonal_naive(series, windows.t, split.horizon, split.period, history_start)
    mean = np.full_like(last, series[slice(*split.train_rows)].mean())
    return NaiveForecasts(last, seasonal, mean)


def _rows_needed(data: SeriesData, n: int) -> int:
    if len(data.values) < n:
        raise ValueError(f"{data.source}: {len(data.values)} rows, the protocol needs the first {n}")
    return n


def _read_csv(path: Path, columns: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """`date` + the first len(columns) columns of a gzip csv: times (T,) datetime64[s], values (T, C) float64."""
    width = 1 + len(columns)
    with gzip.open(path, "rt", encoding="utf-8", newline="") as file:
        reader = csv.reader(file)
        header = next(reader, [])
        if header[:1] != ["date"] or tuple(header[1:width]) != columns:
            raise ForecastFormatError(f"{path}:1: header {header[:width]} is not date + {list(columns)}")
        rows = [row[:width] for row in reader]
    try:
        times = np.array([row[0] for row in rows], dtype="datetime64[s]")
        values = np.array([row[1:] for row in rows], dtype=np.float64)
    except ValueError:
        line = next(i for i, row in enumerate(rows) if not _parses(row, width)) + 2
        raise ForecastFormatError(f"{path}:{line}: not a date and {len(columns)} numbers") from None
    if not np.isfinite(values).all():
        line = int(np.flatnonzero(~np.isfinite(values).all(axis=1))[0]) + 2
        raise ForecastFormatError(f"{path}:{line}: non-finite value")
    return times, values


def _parses(row: list[str], width: int) -> bool:
    try:
        np.datetime64(row[0], "s"), [float(v) for v in row[1:]]
    except (ValueError, IndexError):
        return False
    return len(row) == width


def _regular_step(path: Path, times: np.ndarray) -> int:
    steps = np.diff(times).astype(np.int64)  # (T - 1,) seconds
    bad = np.flatnonzero(steps != steps[0])
    if bad.size or steps[0] <= 0:
        line = int(bad[0]) + 3 if bad.size else 3
        raise ForecastFormatError(f"{path}:{line}: time step breaks the regular {steps[0]} s grid")
    return int(steps[0])


def _clean_jena(path: Path, times: np.ndarray, values: np.ndarray):
    """Drop identical duplicated rows, then interpolate sentinels and short gaps on the regular 10-min grid."""
    seconds = (times - times[0]).astype(np.int64)  # (T,)
    steps = np.diff(seconds)  # (T - 1,)
    for i in np.flatnonzero(steps <= 0):
        if steps[i] < 0 or not np.array_equal(values[i], values[i + 1]):
            raise ForecastFormatError(f"{path}:{i + 3}: timestamp out of order or duplicated with other values")
    bad = np.flatnonzero((steps % 600 != 0) | (steps > 600 * (MAX_FILL + 1)))
    if bad.size:
        raise ForecastFormatError(f"{path}:{bad[0] + 3}: gap of {steps[bad[0]]} s is off the 10-min grid or too long")
    keep = np.r_[True, steps > 0]  # (T,)
    grid = np.full((seconds[-1] // 600 + 1, values.shape[1]), np.nan)  # (T', C)
    grid[seconds[keep] // 600] = np.where(values[keep] == SENTINEL, np.nan, values[keep])
    imputed = np.isnan(grid)
    at = np.arange(len(grid))
    for c in np.flatnonzero(imputed.any(axis=0)):
        grid[imputed[:, c], c] = np.interp(at[imputed[:, c]], at[~imputed[:, c]], grid[~imputed[:, c], c])
    return times[0] + at.astype("timedelta64[s]") * 600, grid, imputed
