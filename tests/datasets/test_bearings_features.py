"""Feature pipeline: exact statistics against the published rows, CWT against pywt, streaming, CSV format."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import pywt
from scipy.ndimage import gaussian_filter1d
from scipy.stats import entropy, kurtosis, skew

import datasets.bearings.extract as extract_module
from datasets.bearings import PRONOSTIA_SPEC, XJTU_SPEC, BearingFileError, degradation, extract_features
from datasets.bearings.features import GaussianStream, WindowStream, cwt_power, window_features
from tests.conftest import REPO

XJTU_FIXTURE = REPO / "tests" / "fixtures" / "bearings" / "xjtu" / "35Hz12kN" / "Bearing1_1"


def _direct_statistics(x: np.ndarray) -> list[float]:
    density, _ = np.histogram(x, bins=3, density=True)
    return [entropy(density + 1e-9), kurtosis(x), skew(x), np.mean(x), np.std(x)]


def _rows(path: Path) -> list[dict[str, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def bearing1_4(shared_data, tmp_path_factory):
    """Full_Test_Set/Bearing1_4/acc_00001.csv is the first snapshot of the published Bearing1_4 (7310 rows)."""
    raw = shared_data / "bearings" / "pronostia_raw" / "fixtures" / "Full_Test_Set" / "Bearing1_4"
    out = tmp_path_factory.mktemp("features") / "Bearing1_4_features.csv"
    progress = []
    n = extract_features(
        raw, out, temperature_files=True, on_progress=lambda done, total: progress.append((done, total))
    )
    published = _rows(shared_data / "bearings" / "features" / "tf_features_pronostia" / "Bearing1_4_features.csv.gz")
    signal = np.array([[float(f) for f in line.split(";")[4:]] for line in (raw / "acc_00001.csv").read_text().split()])
    return n, progress, _rows(out), published, signal, out


def test_published_statistics_reproduced_exactly(bearing1_4):
    n, progress, mine, published, signal, _ = bearing1_4
    assert n == len(mine) == PRONOSTIA_SPEC.n_windows(2560) == 4 and progress == [(1, 1)]
    for i, (row, pub) in enumerate(zip(mine, published, strict=False)):
        for channel, column in ((0, "Horizontal"), (1, "Vertical")):
            ours, theirs = json.loads(row[column]), json.loads(pub[column])
            window = signal[500 * i : 500 * i + 1000, channel]
            assert ours[2:] == theirs[2:]  # entropy, kurtosis, skewness, mean, std: bit-identical
            assert ours[2:] == [float(v) for v in _direct_statistics(window)]
            assert abs(ours[0] / theirs[0] - 1) < 1e-14  # energy
            assert abs(ours[1] - theirs[1]) < 1e-12  # dominant frequency [Hz]
        assert [row[c] for c in ("Time", "RPM", "Load")] == [pub[c] for c in ("Time", "RPM", "Load")]


def test_pywavelets_default_precision_would_not_reproduce(bearing1_4):
    # why FeatureSpec.cwt_precision is 10: PyWavelets >= 1.8 defaults to 12, and the energies move a lot
    *_, published, signal, _ = bearing1_4
    windows = np.stack([signal[500 * i : 500 * i + 1000, 0] for i in range(4)])
    coef, _ = pywt.cwt(windows, PRONOSTIA_SPEC.scales, "cmor1.0-0.5", 1 / 25600, method="fft", axis=-1)
    energy = np.sum(np.abs(coef) ** 2, axis=(0, 2))
    theirs = np.array([json.loads(p["Horizontal"])[0] for p in published[:4]])
    assert np.abs(energy / theirs - 1).max() > 0.3


def test_csv_format_matches_published(bearing1_4):
    *_, out = bearing1_4
    text = out.read_text()
    assert "\r" not in text
    header, first = text.splitlines()[:2]
    assert header == "Horizontal,Vertical,Time,Temperature,Degradation,RPM,Load"
    assert first.startswith('"[31666.4037133285') and first.endswith(",0.0,70.036,0.0,1800.0,4000.0")


@pytest.mark.parametrize("spec", [PRONOSTIA_SPEC, XJTU_SPEC], ids=["pronostia", "xjtu"])
def test_cwt_power_equals_pywt_conv(spec):
    windows = np.random.default_rng(1).standard_t(4, size=(5, 1000))
    coef, freqs = pywt.cwt(windows, spec.scales, spec.wavelet, 1 / spec.fs, method="conv", axis=-1, precision=10)
    reference = np.sum(np.abs(coef) ** 2, axis=-1)  # (n_scales, 5)
    assert np.abs(cwt_power(windows, spec) / reference - 1).max() < 1e-12
    features = window_features(windows, spec)
    assert np.array_equal(features[:, 1], freqs[np.argmax(reference, axis=0)])


def test_window_count_formula():
    assert PRONOSTIA_SPEC.n_windows(911 * 2560) == 4663  # Bearing2_1_features.csv rows
    assert PRONOSTIA_SPEC.n_windows(2375 * 2560) == 12159  # Bearing1_3: (L - 1000) divisible by 500
    assert XJTU_SPEC.n_windows(123 * 32768) == 8000  # Bearing1_1: 8059 windows, kept 8000
    assert PRONOSTIA_SPEC.n_windows(999) == 0 and PRONOSTIA_SPEC.n_windows(1000) == 1
    assert PRONOSTIA_SPEC.times(4).tolist() == [0.0, 0.03906, 0.07812, 0.11719]
    assert XJTU_SPEC.times(3).tolist() == [0.0, 0.0390625, 0.078125]


def _write_pronostia(folder: Path, n_files: int, rows: int, seed: int = 0) -> np.ndarray:
    """A synthetic PRONOSTIA folder (comma, 3-digit-exponent microseconds); returns the signal (n_files*rows, 2)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    signal = np.round(rng.normal(size=(n_files * rows, 2)), 3)
    for k in range(n_files):
        lines = [f"9,{k // 6},{k % 6 * 10},{39 * i:.4e}".replace("e+0", "e+00") + f",{a!r},{b!r}"
                 for i, (a, b) in enumerate(signal[k * rows : (k + 1) * rows].tolist())]  # fmt: skip
        (folder / f"acc_{k + 1:05d}.csv").write_text("\n".join(lines) + "\n")
    return signal


def test_streaming_many_small_files_bounded_memory(tmp_path, monkeypatch):
    signal = _write_pronostia(tmp_path / "Bearing2_1", n_files=300, rows=100)
    peaks = []

    class Watched(WindowStream):
        def push(self, chunk):
            result = super().push(chunk)
            peaks.append(self.max_buffered)
            return result

    monkeypatch.setattr(extract_module, "WindowStream", Watched)
    progress = []
    out = tmp_path / "out.csv"
    n = extract_features(tmp_path / "Bearing2_1", out, rows_per_file=100, on_progress=lambda *a: progress.append(a))
    assert n == (300 * 100 - 1000) // 500 + 1 == 59
    assert progress == [(k, 300) for k in range(1, 301)]
    assert len(peaks) == 300 and max(peaks) <= 1000 + 100  # never more than a window plus one file
    starts = 500 * np.arange(n)
    expected = window_features(np.stack([signal[s : s + 1000, 1] for s in starts]), PRONOSTIA_SPEC)
    rows = _rows(out)
    assert [json.loads(r["Vertical"]) for r in rows] == expected.tolist()
    assert [r["Temperature"] for r in rows] == ["298.15"] * n  # no temperature files: NSAC's fill


@pytest.mark.parametrize("sigma", [0.75, 1.1, 3.0])
def test_gaussian_stream_equals_whole_signal_filter(sigma):
    rng = np.random.default_rng(3)
    signal = rng.normal(size=(5000, 2))
    cuts = np.sort(rng.choice(np.arange(1, 5000), size=40, replace=False))
    stream = GaussianStream(sigma)
    pieces = [stream.push(chunk) for chunk in np.split(signal, cuts)] + [stream.finish()]
    assert np.array_equal(np.concatenate(pieces), gaussian_filter1d(signal, sigma, axis=0, mode="reflect"))


@pytest.mark.parametrize(
    ("order", "files"),
    [("lexicographic", [1, 10, 2, 3, 4, 5, 6, 7, 8, 9]), ("numeric", list(range(1, 11)))],
)
def test_xjtu_fixture_smoothed_rul_and_columns(tmp_path, order, files):
    # the fixture yields 5 windows, not thousands; "lexicographic" is how the published XJTU-SY files were made
    spec = dataclasses.replace(XJTU_SPEC, round_rows_to=None, file_order=order)
    out = tmp_path / "Bearing1_1_features_with_labels.csv"
    n = extract_features(XJTU_FIXTURE, out, spec=spec, rows_per_file=300)
    raw = np.concatenate([np.loadtxt(XJTU_FIXTURE / f"{k}.csv", delimiter=",", skiprows=1) for k in files])
    smooth = gaussian_filter1d(raw, 0.75, axis=0)
    rows = _rows(out)
    assert n == len(rows) == (3000 - 1000) // 500 + 1
    assert list(rows[0]) == ["Horizontal", "Vertical", "RUL", "Time", "RPM", "Load", "Degradation"]
    for i, row in enumerate(rows):
        window = smooth[500 * i : 500 * i + 1000, 0]
        assert json.loads(row["Horizontal"])[2:] == [float(v) for v in _direct_statistics(window)]
        assert int(row["RUL"]) == 10 - (500 * i + 500) // 300  # snapshots after the centre's, by position
        assert float(row["Time"]) == i * 0.0390625 and (row["RPM"], row["Load"]) == ("2100.0", "12000.0")
    assert float(rows[0]["Degradation"]) == 0.0 and float(rows[-1]["Degradation"]) == 1.0


def test_degradation_label_reproduces_xjtu(shared_data):
    published = _rows(
        shared_data / "bearings" / "features" / "tf_features_xjtu" / "Bearing1_1_features_with_labels.csv.gz"
    )
    time = np.array([float(r["Time"]) for r in published])
    label = np.array([float(r["Degradation"]) for r in published])
    assert np.abs(degradation(time, 2100.0, 12000.0) - label).max() < 1e-12


def test_temperature_interpolated_at_window_clock(tmp_path):
    folder = tmp_path / "Bearing1_9"
    _write_pronostia(folder, n_files=3, rows=1000)  # files start 9:00:00, 9:00:10, 9:00:20
    clock = 9 * 3600 + np.arange(600) / 10  # 9:00:00.0 .. 9:00:59.9, temperature rising 1 deg C a second
    lines = [f"9,0,{int(c - 32400)},{round((c % 1) * 10)},{20 + (c - 32400):.1f}" for c in clock]
    (folder / "temp_00001.csv").write_text("\n".join(lines) + "\n")
    extract_features(folder, tmp_path / "d.csv", rows_per_file=1000)  # by default temperature files are not read
    assert {r["Temperature"] for r in _rows(tmp_path / "d.csv")} == {"298.15"}
    extract_features(folder, tmp_path / "t.csv", rows_per_file=1000, temperature_files=True)
    temps = [float(r["Temperature"]) for r in _rows(tmp_path / "t.csv")]
    starts = 500 * np.arange(len(temps))
    expected = 20 + (starts // 1000) * 10 + (starts % 1000) / 25600
    assert np.allclose(temps, expected, atol=1e-9)
    extract_features(folder, tmp_path / "c.csv", rows_per_file=1000, temperature=100.253)
    assert {r["Temperature"] for r in _rows(tmp_path / "c.csv")} == {"100.253"}


def test_failed_run_leaves_previous_output_and_no_partial(tmp_path):
    folder = tmp_path / "Bearing3_1"
    _write_pronostia(folder, n_files=5, rows=400)
    out = tmp_path / "out.csv"
    out.write_text("previous\n")
    bad = folder / "acc_00004.csv"
    bad.write_text(bad.read_text()[:-30])  # truncated mid-line
    with pytest.raises(BearingFileError, match=r"acc_00004\.csv:400: "):
        extract_features(folder, out, rows_per_file=400)
    assert out.read_text() == "previous\n" and not (tmp_path / "out.csv.partial").exists()
