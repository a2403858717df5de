"""`drive bearings features --raw DIR --out FILE.csv`: one raw bearing folder -> its window-feature CSV.

    drive bearings features --raw PHM2012/Learning_set/Bearing2_1 --out Bearing2_1_features.csv --temperature 100.253
    drive bearings features --raw XJTU-SY_Bearing_Datasets/35Hz12kN/Bearing1_1 --out Bearing1_1_features_with_labels.csv

The folder's layout is recognised (PRONOSTIA `acc_NNNNN.csv` [+ `temp_NNNNN.csv`], XJTU-SY `N.csv`) and the
published recipe of its dataset applied (`datasets/bearings/features.py`), streamed snapshot by snapshot: memory holds
one snapshot and one window whatever the number of files; the CSV appears under --out only when complete.

Which options reproduce a published file: XJTU-SY, none (the default spec concatenates snapshots in the published
lexicographic order; `--file-order numeric` gives time order). PRONOSTIA: `--temperature` with the file's constant
fill (Bearing2_1 and 3_2: 100.253; 1_3, 2_2 and 3_1: 290.045; 1_2: 109.95399999999997; 2_3: 112.374), since the
published Temperature is not derivable from the raw temperature files; the bearings whose published Temperature is a
series (1_4, 1_7, 2_4, 2_6, 2_7, 3_3: one value per Time unit, ~100-850) cannot be matched in that column. Then
Horizontal, Vertical, Time, Temperature, RPM and Load match; `Degradation` is the labels ODE (within 1.3e-3 of the
published PRONOSTIA column, whose ODE variant is not published) and `Degradation_monotonic` is not written.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from datasets.bearings import SPECS, BearingFileError, extract_features, find_bearing
from datasets.bearings.extract import CONDITIONS
from drive.errors import UserError
from drive.options import NonNegativeFloat, PositiveFloat, PositiveInt


@dataclass(frozen=True)
class Config:
    raw: Path
    """one bearing folder: PRONOSTIA acc_NNNNN.csv (+ temp_NNNNN.csv) or XJTU-SY N.csv snapshots"""
    out: Path
    """feature CSV to write (the published files' columns; written atomically)"""
    spec: Literal["auto", "pronostia", "xjtu"] = "auto"
    """feature recipe (CWT band, smoothing, Time rounding): auto = the folder's own dataset's"""
    file_order: Literal["spec", "numeric", "lexicographic"] = "spec"
    """snapshot concatenation order: the spec's (XJTU-SY: lexicographic as published), numeric = time order"""
    rpm: PositiveFloat | None = None
    """shaft speed written to RPM and used by the Degradation ODE; None: from the folder name's condition"""
    load: NonNegativeFloat | None = None
    """radial load [N]; None: from the folder name's condition"""
    temperature: float | None = None
    """constant Temperature column; None: the temperature files interpolated (298.15 without any)"""
    all_windows: bool = False
    """keep every window (XJTU-SY's published files keep a multiple of 1000)"""
    rows_per_file: PositiveInt | None = None
    """samples per snapshot if not the format's (2560 PRONOSTIA, 32768 XJTU-SY), e.g. a shortened fixture"""
    progress: bool = True
    """show a progress bar over the snapshot files"""


def _check(cfg: Config) -> str:
    """The folder's layout, after the checks that need no feature computed (each a one-line error)."""
    if cfg.rows_per_file is not None and cfg.rows_per_file < 1:
        raise UserError(f"--rows-per-file must be >= 1, got {cfg.rows_per_file}")
    if not cfg.out.parent.is_dir():
        raise UserError(f"--out {cfg.out}: folder {cfg.out.parent} does not exist")
    bearing = find_bearing(cfg.raw, cfg.rows_per_file)
    match = re.fullmatch(r"Bearing(\d)_\d+", bearing.name)
    known = match is not None and int(match.group(1)) in CONDITIONS[bearing.layout]
    if not known and (cfg.rpm is None or cfg.load is None):
        raise UserError(f"--raw {cfg.raw}: no operating condition in the folder name (BearingC_K): pass --rpm, --load")
    return bearing.layout


def run(cfg: Config) -> int:
    from tqdm import tqdm

    try:
        layout = _check(cfg)
        spec = SPECS[layout if cfg.spec == "auto" else cfg.spec]
        if cfg.file_order != "spec":
            spec = dataclasses.replace(spec, file_order=cfg.file_order)
        if cfg.all_windows:
            spec = dataclasses.replace(spec, round_rows_to=None)
        bar = tqdm(unit="file", desc=cfg.raw.name, disable=not cfg.progress, mininterval=0.5)

        files = [0]

        def on_progress(done: int, total: int) -> None:
            bar.total, files[0] = total, done
            bar.update(done - bar.n)

        t0 = time.perf_counter()
        with bar:
            n = extract_features(cfg.raw, cfg.out, spec=spec, rpm=cfg.rpm, load=cfg.load, temperature=cfg.temperature,
                                 rows_per_file=cfg.rows_per_file, on_progress=on_progress)  # fmt: skip
    except BearingFileError as exc:
        raise UserError(str(exc)) from None
    print(f"wrote {n} rows ({layout} layout, {files[0]} files, {time.perf_counter() - t0:.1f} s) to {cfg.out}")
    return 0
