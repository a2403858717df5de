"""Bearing run-to-failure data for the NSAC degradation experiment: XJTU-SY, PRONOSTIA (FEMTO-ST), HUST.

Layers, each module documenting its source, formats, quirks and departures:
- `raw`: PRONOSTIA and XJTU-SY snapshot readers (`find_bearing`, `read_pronostia_acc`, ...; `BearingFileError`).
- `features`: the published per-window recipe (`FeatureSpec`, `window_features`) and the streaming pieces.
- `labels`: the ODE behind the `Degradation` label.
- `extract`: one raw bearing folder -> a feature CSV in the published format (`extract_features`).
- `table`: the published feature CSVs (`read_feature_csv`, `staged_files`); `protocol`: the NSAC splits.
Never imports `drive`, `agents` or `sim_bridges`.
"""

from .extract import extract_features
from .features import PRONOSTIA_SPEC, SPECS, XJTU_SPEC, FeatureSpec, window_features
from .labels import degradation
from .protocol import BearingSplit, Standardiser, TestBearing, nsac_split, train_val_indices
from .raw import BearingFileError, RawBearing, find_bearing, read_pronostia_acc, read_pronostia_temp, read_xjtu
from .table import PAPER_TESTS, SEEDS, TRAIN, FeatureTable, input_names, read_feature_csv, staged_files

__all__ = [
    "PAPER_TESTS",
    "PRONOSTIA_SPEC",
    "SEEDS",
    "SPECS",
    "TRAIN",
    "XJTU_SPEC",
    "BearingFileError",
    "BearingSplit",
    "FeatureSpec",
    "FeatureTable",
    "RawBearing",
    "Standardiser",
    "TestBearing",
    "degradation",
    "extract_features",
    "find_bearing",
    "input_names",
    "nsac_split",
    "read_feature_csv",
    "read_pronostia_acc",
    "read_pronostia_temp",
    "read_xjtu",
    "staged_files",
    "train_val_indices",
    "window_features",
]
