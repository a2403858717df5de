"""The published bearing feature CSVs and the NSAC fourth-experiment protocol (train XJTU-SY, test across datasets).

Files: `<data root>/bearings/features/tf_features_{xjtu,pronostia,hust}/*.csv[.gz]` (itxwaleedrazzaq/uqpcnn_rul
@ 78aadd56, staged gzipped; PROVENANCE.md section 1), or any CSV `extract.extract_features` wrote. Format: a header;
`Horizontal` and `Vertical` are stringified 7-float lists `[energy, dominant_frequency, entropy, kurtosis,
skewness, mean, std]`; then `Time`, `RPM`, `Load`, a label and, for PRONOSTIA and HUST, `Temperature`. Quirks:
- Energy is raw; inputs use log10(energy + 1e-8), as NSAC's `utils/preprocess.process_features`.
- The label is `Degradation`; PRONOSTIA Bearing1_3's is empty (NaN) in every row, so that file, and any whose
  `Degradation` is entirely NaN, uses `Degradation_monotonic` (`FeatureTable.label_column` says which). A label
  NaN in some rows only is an error.
- No `Temperature` column (XJTU-SY) -> 298.15 (25 + 273.15, NSAC's fill); where present it is used as written,
  though its units and meaning vary (PRONOSTIA constant fills 100.253 / 290.045, deg C series; HUST 25).
- XJTU-SY rows follow the snapshots in lexicographic file order (1, 10, 100, ...), not time (`features.py`):
  Time, RUL and Degradation rise with the row, but the failure snapshots sit early (Bearing1_1 rows ~130-780 and
  ~1570-1830 of 8000). Read as written; training on them inherits this.
- Degradation is non-decreasing in every staged file except PRONOSTIA Bearing2_6 (10 steps down, at most 1.1e-5).
Malformed cells raise `BearingFileError` naming the file and line.

Protocol (itxwaleedrazzaq/neuronal_stochastic_attention_circuit @ 867c8aa7, `RUL_exp/rul_random.py` and
`rul_test.py`): inputs X = [7 horizontal, 7 vertical features, Time, Temperature] (16; 15 with
`include_time=False`, since the label is a deterministic function of Time), target Degradation. Train on XJTU-SY
Bearing1_1..1_3 concatenated; the standardiser is fitted on all their rows (as NSAC: before the split); then a
90/10 random split per seed 42..46 reproducing `sklearn.model_selection.train_test_split(test_size=0.1,
random_state=seed)` index for index (RandomState(seed).permutation; the first ceil(0.1 n) are validation).
Tests: XJTU-SY Bearing1_1 (in-distribution: it is also trained on), PRONOSTIA Bearing2_1 and HUST Bearing1, plus
every other staged bearing not trained on. Departure: NSAC's rul_test.py refits a StandardScaler on each test
bearing itself; by default the training scaler is applied (no test statistics leak in). `test_scaling=
"per_bearing"` reproduces theirs. Consequence of the default to know: Temperature is constant 298.15 in training
(scale 1), so PRONOSTIA's 100.253 becomes -197.9 and HUST's 25 becomes -273.15 after standardising.
"""

from __future__ import annotations

import csv
import gzip
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..root import data_folder
from .features import FEATURE_NAMES
from .raw import BearingFileError

LOG_EPS = 1e-8  # NSAC: log10(energy + 1e-8)
NO_TEMPERATURE = 298.15
FOLDERS = {"xjtu": "tf_features_xjtu", "pronostia": "tf_features_pronostia", "hust": "tf_features_hust"}
TRAIN = ("xjtu/Bearing1_1", "xjtu/Bearing1_2", "xjtu/Bearing1_3")
PAPER_TESTS = ("xjtu/Bearing1_1", "pronostia/Bearing2_1", "hust/Bearing1")
SEEDS = (42, 43, 44, 45, 46)
VAL_FRACTION = 0.1


@dataclass(frozen=True)
class FeatureTable:
    """One bearing's feature file, columns as arrays."""

    name: str  # "<dataset>/<bearing>", e.g. "pronostia/Bearing2_1"
    path: Path
    horizontal: np.ndarray  # (N, 7) FEATURE_NAMES, energy raw
    vertical: np.ndarray  # (N, 7)
    time: np.ndarray  # (N,)
    temperature: np.ndarray | None  # (N,) as written; None when the file has no Temperature column
    rpm: np.ndarray  # (N,)
    load: np.ndarray  # (N,)
    label: np.ndarray  # (N,) in [0, 1]
    label_column: str  # "Degradation", or "Degradation_monotonic" where Degradation is all NaN
    rul: np.ndarray | None  # (N,) XJTU-SY remaining snapshots (minutes); None elsewhere

    def __len__(self) -> int:
        return len(self.time)

    def inputs(self, include_time: bool = True) -> np.ndarray:
        """(N, 16) NSAC inputs [log10-energy H features, V features, Time, Temperature]; (N, 15) without Time."""
        channels = []
        for values in (self.horizontal, self.vertical):
            channels.append(np.column_stack([np.log10(values[:, 0] + LOG_EPS), values[:, 1:]]))  # (N, 7)
        temperature = self.temperature if self.temperature is not None else np.full(len(self), NO_TEMPERATURE)
        extra = [self.time, temperature] if include_time else [temperature]
        return np.column_stack([*channels, *extra])


def input_names(include_time: bool = True) -> tuple[str, ...]:
    names = ["log10_energy", *FEATURE_NAMES[1:]]
    per_channel = [f"{ch}_{n}" for ch in ("horizontal", "vertical") for n in names]
    return (*per_channel, *(["Time"] if include_time else []), "Temperature")


def _lists(path: Path, cells: list[str], column: str) -> np.ndarray:
    """Stringified 7-float lists -> (N, 7); the first malformed cell is reported with its line."""
    try:
        if all(c.startswith("[") and c.endswith("]") for c in cells):
            values = np.array(",".join(c[1:-1] for c in cells).split(","), dtype=np.float64)
            if values.size == 7 * len(cells):
                return values.reshape(-1, 7)
    except ValueError:
        pass
    for line, cell in enumerate(cells, start=2):
        fields = cell[1:-1].split(",") if cell.startswith("[") and cell.endswith("]") else []
        try:
            ok = len(fields) == 7 and all(isinstance(float(f), float) for f in fields)
        except ValueError:
            ok = False
        if not ok:
            raise BearingFileError(path, line, f"{column} is not a list of 7 numbers: {cell[:60]!r}")
    raise BearingFileError(path, None, f"{column}: unparseable")  # not reached


def _numbers(path: Path, cells: list[str], column: str) -> np.ndarray:
    """Plain numeric column -> (N,); empty cells are NaN."""
    try:
        return np.array([float(c) if c.strip() else math.nan for c in cells])
    except ValueError:
        line = next(k for k, c in enumerate(cells, start=2) if not _is_number(c))
        raise BearingFileError(path, line, f"{column} is not a number: {cells[line - 2][:40]!r}") from None


def _is_number(cell: str) -> bool:
    try:
        float(cell)
        return True
    except ValueError:
        return not cell.strip()


def _label(path: Path, columns: dict[str, np.ndarray]) -> tuple[np.ndarray, str]:
    name = "Degradation"
    if name not in columns or np.isnan(columns[name]).all():
        name = "Degradation_monotonic"
    if name not in columns:
        raise BearingFileError(path, 1, "no usable Degradation or Degradation_monotonic column")
    label = columns[name]
    if np.isnan(label).any():
        raise BearingFileError(path, 2 + int(np.argmax(np.isnan(label))), f"{name} is empty or NaN")
    return label, name


def read_feature_csv(path: str | os.PathLike, name: str | None = None) -> FeatureTable:
    """One feature file (`.csv` or `.csv.gz`). `name` defaults to "<folder>/<bearing>" from the path."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        rows = list(reader)
    required = {"Horizontal", "Vertical", "Time", "RPM", "Load"}
    if header is None or not required <= set(header):
        raise BearingFileError(path, 1, f"header must hold {sorted(required)}, got {header}")
    for line, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise BearingFileError(path, line, f"{len(row)} fields, expected {len(header)}")
    if not rows:
        raise BearingFileError(path, 2, "no data rows")
    cells = {column: [row[k] for row in rows] for k, column in enumerate(header)}
    numbers = {c: _numbers(path, v, c) for c, v in cells.items() if c not in ("Horizontal", "Vertical")}
    label, label_column = _label(path, numbers)
    bearing = path.name.split("_features")[0]
    dataset = next((d for d, folder in FOLDERS.items() if path.parent.name == folder), path.parent.name)
    return FeatureTable(
        name=name or f"{dataset}/{bearing}",
        path=path,
        horizontal=_lists(path, cells["Horizontal"], "Horizontal"),
        vertical=_lists(path, cells["Vertical"], "Vertical"),
        time=numbers["Time"],
        temperature=numbers.get("Temperature"),
        rpm=numbers["RPM"],
        load=numbers["Load"],
        label=label,
        label_column=label_column,
        rul=numbers.get("RUL"),
    )


def staged_files(data_root: str | os.PathLike | None = None) -> dict[str, Path]:
    """Every staged feature file: {"xjtu/Bearing1_1": path, ...}, sorted by name."""
    features = data_folder("bearings", data_root) / "features"
    found = {}
    for dataset, folder in FOLDERS.items():
        for path in sorted((features / folder).glob("*_features*.csv*")):
            found[f"{dataset}/{path.name.split('_features')[0]}"] = path
    return dict(sorted(found.items()))
