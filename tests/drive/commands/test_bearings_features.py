"""`drive bearings features`: raw fixtures -> rows equal to a direct numpy / scipy / pywt computation on the same
windows and to the published file, the progress bar, one-line errors naming file and line with exit code 2, a stopped
run's short last files reported in one note each, the folder positional or `--raw`."""

from __future__ import annotations

import csv
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import pywt
from scipy.ndimage import gaussian_filter1d
from scipy.stats import entropy, kurtosis, skew

from datasets.bearings import PRONOSTIA_SPEC, XJTU_SPEC
from drive.cli import main
from tests.conftest import REPO
from tests.datasets.bearing_runs import write_run

XJTU_FIXTURE = REPO / "tests" / "fixtures" / "bearings" / "xjtu" / "35Hz12kN" / "Bearing1_1"


def _rows(path: Path) -> list[dict[str, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as handle:
        return list(csv.DictReader(handle))


def _direct(window: np.ndarray, spec) -> list[float]:
    """The 7 published features of one window, each from its library call (pywt.cwt at the spec's precision)."""
    coef, freqs = pywt.cwt(window, spec.scales, spec.wavelet, sampling_period=1 / spec.fs, precision=spec.cwt_precision)
    power = (np.abs(coef) ** 2).sum(axis=1)  # (n_scales,)
    density, _ = np.histogram(window, bins=3, density=True)
    return [power.sum(), freqs[np.argmax(power)], entropy(density + 1e-9), kurtosis(window), skew(window),
            np.mean(window), np.std(window)]  # fmt: skip


def _check_row(ours: list[float], direct: list[float]) -> None:
    assert ours[2:] == [float(v) for v in direct[2:]]  # entropy, kurtosis, skewness, mean, std: bit-identical
    assert abs(ours[0] / direct[0] - 1) < 1e-12 and abs(ours[1] - direct[1]) < 1e-9  # energy, dominant frequency


@pytest.fixture(scope="module")
def bearing1_4(shared_data) -> Path:
    return shared_data / "bearings" / "pronostia_raw" / "fixtures" / "Full_Test_Set" / "Bearing1_4"


def test_pronostia_rows_equal_direct_computation_and_published(bearing1_4, shared_data, tmp_path, capsys):
    out = tmp_path / "Bearing1_4_features.csv"
    assert main(["bearings", "features", "--raw", str(bearing1_4), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "1/1" in captured.err and "wrote 4 rows (pronostia layout, 1 files" in captured.out  # the bar ran
    signal = np.array([[float(f) for f in line.split(";")[4:]] for line in (bearing1_4 / "acc_00001.csv").read_text()
                       .split()])  # fmt: skip
    rows = _rows(out)
    published = _rows(shared_data / "bearings" / "features" / "tf_features_pronostia" / "Bearing1_4_features.csv.gz")
    assert len(rows) == PRONOSTIA_SPEC.n_windows(2560) == 4 and list(rows[0]) == list(published[0])[:7]
    for i, (row, pub) in enumerate(zip(rows, published, strict=False)):
        for channel, column in ((0, "Horizontal"), (1, "Vertical")):
            ours = json.loads(row[column])
            _check_row(ours, _direct(signal[500 * i : 500 * i + 1000, channel], PRONOSTIA_SPEC))
            theirs = json.loads(pub[column])
            assert ours[2:] == theirs[2:] and abs(ours[0] / theirs[0] - 1) < 1e-14 and abs(ours[1] - theirs[1]) < 1e-12
        assert [row[c] for c in ("Time", "RPM", "Load")] == [pub[c] for c in ("Time", "RPM", "Load")]


def test_options_temperature_rpm_and_quiet(bearing1_4, tmp_path, capsys):
    folder = tmp_path / "Bearing7_1"  # condition 7 does not exist: rpm and load must be given
    shutil.copytree(bearing1_4, folder)
    out = tmp_path / "f.csv"
    assert main(["bearings", "features", "--raw", str(folder), "--out", str(out), "--no-progress", "--rpm", "1650",
                 "--load", "4200", "--temperature", "100.253"]) == 0  # fmt: skip
    assert capsys.readouterr().err == ""
    rows = _rows(out)
    assert {(r["Temperature"], r["RPM"], r["Load"]) for r in rows} == {("100.253", "1650.0", "4200.0")}
    assert main(["bearings", "features", "--raw", str(folder), "--out", str(out)]) == 2
    assert "no operating condition" in capsys.readouterr().err


@pytest.mark.parametrize(("order", "files"), [("spec", [1, 10, 2, 3, 4, 5, 6, 7, 8, 9]), ("numeric", range(1, 11))])
def test_xjtu_fixture_smoothed_windows_in_file_order(tmp_path, order, files):
    out = tmp_path / "Bearing1_1_features_with_labels.csv"
    argv = ["bearings", "features", "--raw", str(XJTU_FIXTURE), "--out", str(out), "--rows-per-file", "300",
            "--all-windows", "--file-order", order, "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    raw = np.concatenate([np.loadtxt(XJTU_FIXTURE / f"{k}.csv", delimiter=",", skiprows=1) for k in files])
    smooth = gaussian_filter1d(raw, 0.75, axis=0)  # XJTU-SY's published recipe smooths first
    rows = _rows(out)
    assert len(rows) == (3000 - 1000) // 500 + 1
    for i, row in enumerate(rows):
        _check_row(json.loads(row["Vertical"]), _direct(smooth[500 * i : 500 * i + 1000, 1], XJTU_SPEC))
        assert int(row["RUL"]) == 10 - (500 * i + 500) // 300
    assert main(argv[:-4] + ["--no-progress"]) == 0 and _rows(out) == []  # 5 windows round down to 0 x 1000


def _broken_copy(source: Path, tmp_path: Path, edit) -> tuple[Path, Path]:
    folder = tmp_path / "Bearing1_4"
    shutil.copytree(source, folder)
    path = folder / "acc_00001.csv"
    path.write_text("".join(edit(path.read_text().splitlines(keepends=True))))
    return folder, path


@pytest.mark.parametrize(
    ("edit", "line", "what"),
    [
        (lambda ls: ls[:1200], 1201, "file ends after 1200 of 2560 rows"),  # truncated at a line end
        (lambda ls: [*ls[:1200], ls[1200][:9]], 1201, "fields, expected 6"),  # truncated mid-line
        (lambda ls: [*ls[:16], ls[16].replace("0", "x", 1), *ls[17:]], 17, "not a number"),
    ],
)
def test_malformed_file_is_one_line_naming_file_and_line(bearing1_4, tmp_path, capsys, edit, line, what):
    folder, path = _broken_copy(bearing1_4, tmp_path, edit)
    out = tmp_path / "out.csv"
    assert main(["bearings", "features", "--raw", str(folder), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"drive bearings features: error: {path}:{line}: ") and what in err
    assert err.count("\n") == 1 and not out.exists() and not (tmp_path / "out.csv.partial").exists()


@pytest.mark.parametrize(
    ("raw", "out", "what"),
    [("missing", "out.csv", "bearing folder not found"), ("empty", "out.csv", "no PRONOSTIA acc_NNNNN.csv"),
     ("ok", "nodir/out.csv", "does not exist")],
)  # fmt: skip
def test_bad_paths_exit_2_with_one_line(bearing1_4, tmp_path, capsys, raw, out, what):
    (tmp_path / "empty").mkdir()
    folder = bearing1_4 if raw == "ok" else tmp_path / raw
    assert main(["bearings", "features", "--raw", str(folder), "--out", str(tmp_path / out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("drive bearings features: error: ") and what in err and err.count("\n") == 1


@pytest.fixture
def stopped_run(shared_data, tmp_path) -> Path:
    """A Bearing2_1-like run as the real folder ends: the last acc file and the last temp file cut short."""
    fixtures = shared_data / "bearings" / "pronostia_raw" / "fixtures"
    return write_run(fixtures, tmp_path / "Bearing2_1", acc_rows={5: 1280}, temp_rows={2: 37})


def test_stopped_run_exit_0_with_one_note_per_file(stopped_run, tmp_path, capsys):
    out = tmp_path / "f.csv"
    assert main(["bearings", "features", str(stopped_run), "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    acc_note = (f"drive bearings features: note: {stopped_run / 'acc_00005.csv'}: 1280 of 2560 rows (the run stopped "
                "mid-snapshot): dropped, features from the 4 complete snapshots\n")  # fmt: skip
    assert captured.err == acc_note  # temperature files untouched: no word about the short temp_00002.csv
    assert captured.out.startswith("wrote 19 rows (pronostia layout, 4 files, ")
    assert len(_rows(out)) == PRONOSTIA_SPEC.n_windows(4 * 2560) == 19
    argv = ["bearings", "features", "--raw", str(stopped_run), "--out", str(tmp_path / "t.csv"), "--temperature-files"]
    assert main(argv) == 0  # with the progress bar: the notes still reach stderr, one line each
    err = capsys.readouterr().err
    assert acc_note in err and (f"drive bearings features: note: {stopped_run / 'temp_00002.csv'}: 37 of 600 rows "
                                "(the run stopped): its readings used as far as they go\n") in err  # fmt: skip
    assert [r["Horizontal"] for r in _rows(tmp_path / "t.csv")] == [r["Horizontal"] for r in _rows(out)]


def test_short_middle_file_is_still_an_error(stopped_run, tmp_path, capsys):
    middle = stopped_run / "acc_00003.csv"
    middle.write_text("".join(middle.read_text().splitlines(keepends=True)[:2000]))
    assert main(["bearings", "features", str(stopped_run), "--out", str(tmp_path / "f.csv"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"drive bearings features: error: {middle}:2001: file ends after 2000 of 2560 rows\n")
    assert not (tmp_path / "f.csv").exists()


def test_readme_form_positional_folder_default_out(stopped_run, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["bearings", "features", str(stopped_run), "--no-progress"]) == 0  # `drive bearings features RAW_DIR`
    assert "to Bearing2_1_features.csv" in capsys.readouterr().out
    assert len(_rows(work / "Bearing2_1_features.csv")) == 19
    assert main(["bearings", "features", "--raw", str(stopped_run), "--out", "old.csv", "--no-progress"]) == 0
    assert (work / "old.csv").read_bytes() == (work / "Bearing2_1_features.csv").read_bytes()
    assert main(["bearings", "features", str(XJTU_FIXTURE), "--rows-per-file", "300", "--no-progress"]) == 0
    assert (work / "Bearing1_1_features_with_labels.csv").exists()


@pytest.mark.parametrize(
    ("args", "what"),
    [(["{run}/acc_00001.csv"], "acc_00001.csv: is a file, not a bearing folder (one folder per bearing: PRONOSTIA "
                                "acc_00001.csv, acc_00002.csv, ... or XJTU-SY 1.csv, 2.csv, ...); did you mean its "
                                "folder {run}?"),
     ([], "no bearing folder: drive bearings features RAW_DIR (or --raw RAW_DIR)"),
     (["{run}", "--raw", "{tmp}"], "two bearing folders"),
     (["{run}", "--temperature", "20", "--temperature-files"], "--temperature (a constant) and --temperature-files"),
     ([str(XJTU_FIXTURE), "--temperature-files"], "XJTU-SY records no temperature")],
)  # fmt: skip
def test_folder_and_temperature_mistakes_exit_2(stopped_run, tmp_path, capsys, args, what):
    argv = [a.format(run=stopped_run, tmp=tmp_path) for a in args]
    assert main(["bearings", "features", *argv, "--out", str(tmp_path / "f.csv"), "--no-progress"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("drive bearings features: error: ") and what.format(run=stopped_run) in err[-1]
