"""Forecast loaders on the real files: ETT / Jena contents, the three split protocols, naive reference MSEs."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from datasets.forecast import (
    ETT_COLUMNS,
    JENA_COLUMNS,
    JENA_FILE,
    SENTINEL,
    ForecastFormatError,
    load_series,
    naive_forecasts,
    seasonal_naive,
    split_series,
)

L, H = 48, 24


@pytest.fixture(scope="module")
def ettm1(shared_data):
    return load_series("ettm1", shared_data)


@pytest.fixture(scope="module")
def jena(shared_data):
    return load_series("jena", shared_data)


def _row(data, stamp):
    (rows,) = np.nonzero(data.times == np.datetime64(stamp))
    assert len(rows) == 1, stamp
    return int(rows[0])


def _mse(a, b):
    return float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))


@pytest.mark.parametrize(
    "name, rows, step, last",
    [
        ("etth1", 17420, 3600, "2018-06-26T19:00"),
        ("etth2", 17420, 3600, "2018-06-26T19:00"),
        ("ettm1", 69680, 900, "2018-06-26T19:45"),
        ("ettm2", 69680, 900, "2018-06-26T19:45"),
    ],
)
def test_ett_files_load_as_documented(shared_data, name, rows, step, last):
    data = load_series(name, shared_data)
    assert data.values.shape == (rows, 7) and data.columns == ETT_COLUMNS and data.columns[-1] == "OT"
    assert data.step_s == step and data.period == 86400 // step
    assert data.times[0] == np.datetime64("2016-07-01T00:00") and data.times[-1] == np.datetime64(last)
    assert (np.diff(data.times).astype(int) == step).all()
    assert not data.imputed.any() and data.year is None
    if name == "ettm1":  # the file's first row
        np.testing.assert_allclose(data.values[0, [0, -1]], [5.827000141143799, 30.5310001373291])


def test_jena_sentinel_duplicate_and_gap_are_handled(jena):
    assert jena.values.shape == (52704, 14) and jena.year == 2020 and jena.period == 144
    assert jena.columns[-1] == "T (degC)" and sorted(jena.columns) == sorted(JENA_COLUMNS)
    assert jena.times[0] == np.datetime64("2020-01-01T00:10") and jena.times[-1] == np.datetime64("2021-01-01")
    assert (np.diff(jena.times).astype(int) == 600).all()  # regular grid: duplicate dropped, gap filled
    assert (jena.values > SENTINEL / 2).all()
    np.testing.assert_allclose(jena.values[0, [0, -1]], [1008.89, 0.71])  # first raw row: p, T
    # the -9999 in wv at 2020-02-20 07:40 becomes the midpoint of its neighbours (2.18, 2.80)
    wv, sentinel = jena.columns.index("wv (m/s)"), _row(jena, "2020-02-20T07:40")
    np.testing.assert_allclose(jena.values[sentinel, wv], (2.18 + 2.80) / 2)
    _row(jena, "2020-05-12T06:00")  # exactly one row left
    # 9 missing steps between 09:30 (T 17.17) and 11:10 (T 15.28) are linear in time
    before, after = _row(jena, "2020-05-29T09:30"), _row(jena, "2020-05-29T11:10")
    assert after - before == 10
    np.testing.assert_allclose(jena.values[before : after + 1, -1], np.linspace(17.17, 15.28, 11))
    gap_rows = set(range(before + 1, after))
    assert set(np.flatnonzero(jena.imputed.any(axis=1))) == gap_rows | {sentinel}
    assert jena.imputed[sentinel].sum() == 1 and jena.imputed[sentinel, wv]


@pytest.mark.parametrize("name", ["ettm1", "jena"])
def test_paper_protocol_splits_each_part_on_its_own(ettm1, jena, name):
    data = {"ettm1": ettm1, "jena": jena}[name]
    s = split_series(data, "paper")
    assert (s.train_rows, s.val_rows, s.test_rows) == ((0, 20000), (20000, 22500), (22500, 25000))
    assert s.scaler.kind == "minmax" and s.year == data.year and s.scaled.shape == (25000, data.values.shape[1])
    for part, (start, stop) in ((s.train, s.train_rows), (s.val, s.val_rows), (s.test, s.test_rows)):
        assert len(part.t) == stop - start - L - H  # the authors' range(len - L - H)
        assert part.x.shape == (len(part.t), L, data.values.shape[1]) and part.y.shape == (len(part.t), H)
        assert part.t[0] - L == start  # the look-back starts in the split's own rows, never in the previous one
        assert part.t[-1] + H < stop  # every target step inside the split's rows
        np.testing.assert_array_equal(np.diff(part.t), 1)
    assert s.train.t[-1] + H <= s.val.t[0] - L and s.val.t[-1] + H <= s.test.t[0] - L
    # window contents: the scaled rows [t - L, t) and the target rows [t, t + H)
    k = 17
    np.testing.assert_array_equal(s.val.x[k], s.scaled[s.val.t[k] - L : s.val.t[k]])
    np.testing.assert_array_equal(s.val.y[k], s.scaled[s.val.t[k] : s.val.t[k] + H, -1])
    expected = s.scaler.transform(data.values[s.test.t[k] - L : s.test.t[k]])
    np.testing.assert_allclose(s.test.x[k], expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name, kind", [("ettm1", "minmax"), ("jena", "standard")])
def test_authors_protocol_cuts_validation_from_the_train_windows(ettm1, jena, name, kind):
    s = split_series({"ettm1": ettm1, "jena": jena}[name], "authors")
    assert s.scaler.kind == kind and s.train_rows == (0, 13500) and s.test_rows == (13500, 15000)
    assert (len(s.train.t), len(s.val.t), len(s.test.t)) == (12085, 1343, 1428)
    # validation = the time-ordered tail of the train part's windows (train_test_split(shuffle=False))
    np.testing.assert_array_equal(np.r_[s.train.t, s.val.t], np.arange(L, 13500 - H))
    assert s.val_rows == (s.val.t[0] - L, 13500)
    # the documented overlap: the last L + H - 1 training windows reach into the validation windows' rows
    assert int((s.train.t + H > s.val_rows[0]).sum()) == L + H - 1
    # the test part is clean: its look-back starts in its own rows, no other window touches them
    assert s.test.t[0] - L == 13500 and s.test.t[-1] + H < 15000
    assert s.val.t[-1] + H <= 13500


@pytest.mark.parametrize("name, month, horizon", [("etth1", 720, 96), ("ettm2", 2880, 192)])
def test_informer_protocol(shared_data, name, month, horizon):
    data = load_series(name, shared_data)
    s = split_series(data, "informer", lookback=96, horizon=horizon)
    assert (s.train_rows, s.val_rows, s.test_rows) == (
        (0, 12 * month),
        (12 * month, 16 * month),
        (16 * month, 20 * month),
    )
    assert s.scaler.kind == "standard"
    np.testing.assert_allclose(s.scaler.transform(data.values[: 12 * month]).mean(axis=0), 0, atol=1e-9)
    np.testing.assert_allclose(s.scaler.transform(data.values[: 12 * month]).std(axis=0), 1, rtol=1e-9)
    for part, (start, stop), previous in ((s.val, s.val_rows, s.train_rows), (s.test, s.test_rows, s.val_rows)):
        assert part.t[0] == start and part.t[-1] + horizon == stop  # all targets in the split, none left over
        assert previous[0] <= part.t[0] - 96 < previous[1] == start  # the first look-back starts in the previous split
    assert len(s.train.t) == 12 * month - 96 - horizon + 1 and len(s.val.t) == 4 * month - horizon + 1
    assert s.train.t[-1] + horizon == 12 * month  # the first val look-back reaches back, never into test
    with pytest.raises(ValueError, match="ETT only"):
        split_series(load_series("jena", shared_data), "informer")


@pytest.mark.parametrize("protocol", ["paper", "authors"])
def test_scaler_is_fitted_on_train_rows_only(ettm1, protocol):
    s = split_series(ettm1, protocol)
    values = ettm1.values.copy()
    values[s.train_rows[1] :] = values[s.train_rows[1] :] * 3 - 50
    t = split_series(ettm1._replace(values=values), protocol)
    np.testing.assert_array_equal(s.scaler.offset, t.scaler.offset)
    np.testing.assert_array_equal(s.scaler.scale, t.scaler.scale)
    np.testing.assert_array_equal(s.train.x, t.train.x)
    assert not np.allclose(s.test.y, t.test.y)
    train = ettm1.values[slice(*s.train_rows)]
    np.testing.assert_allclose(s.scaler.scale, train.max(axis=0) - train.min(axis=0))


def test_target_inverse_transform_round_trips(ettm1, jena):
    for data, protocol in ((ettm1, "paper"), (jena, "authors")):
        s = split_series(data, protocol)
        rows = s.test.t[:, None] + np.arange(H)  # (N, H)
        original = data.values[rows, -1]
        np.testing.assert_allclose(s.target_scaler.inverse_transform(s.test.y), original, rtol=1e-5, atol=1e-4)
        scaled_var = s.test.y.astype(np.float64).var(axis=0)
        np.testing.assert_allclose(s.target_scaler.inverse_var(scaled_var), original.var(axis=0), rtol=1e-4)


def test_seasonal_naive_never_reads_the_future():
    series = np.arange(100.0)
    t = np.array([3, 10, 50])
    out = seasonal_naive(series, t, horizon=6, period=4)
    np.testing.assert_array_equal(out[1], [6, 7, 8, 9, 6, 7])  # h >= P repeats the last period
    np.testing.assert_array_equal(out[0], [2] * 6)  # under one period of history: the last value
    assert (out < t[:, None]).all()
    np.testing.assert_array_equal(seasonal_naive(series, t, 6, 4, history_start=8)[1], [9] * 6)


def test_naive_reference_mse_of_the_issue(ettm1, jena):
    """Paper protocol, test split, scaled units, all 24 steps; tolerance half a unit of the issue's last digit."""
    s = split_series(ettm1, "paper")
    full, own = naive_forecasts(s, s.test), naive_forecasts(s, s.test, history_start=s.test_rows[0])
    assert _mse(full.last_value, s.test.y) == pytest.approx(0.0012, abs=5e-5)
    assert _mse(full.train_mean, s.test.y) == pytest.approx(0.047, abs=5e-4)
    assert _mse(full.seasonal, s.test.y) == pytest.approx(0.0042, abs=5e-5)  # the whole history before t
    assert _mse(own.seasonal, s.test.y) == pytest.approx(0.0034, abs=5e-5)  # the issue's: test rows only
    s = split_series(jena, "paper")
    full, own = naive_forecasts(s, s.test), naive_forecasts(s, s.test, history_start=s.test_rows[0])
    assert _mse(full.last_value, s.test.y) == pytest.approx(0.0043, abs=5e-5)
    inverse = s.target_scaler.inverse_transform
    assert _mse(inverse(full.last_value), inverse(s.test.y)) == pytest.approx(3.72, abs=5e-3)  # degC^2
    assert _mse(own.seasonal, s.test.y) == pytest.approx(0.0129, abs=5e-5)
    assert _mse(full.seasonal, s.test.y) == pytest.approx(0.0131, abs=5e-5)


def _write_jena(root, lines):
    folder = root / "jena_climate"
    folder.mkdir(parents=True, exist_ok=True)
    header = ",".join(["date", *JENA_COLUMNS, "OT"])
    with gzip.open(folder / JENA_FILE, "wt", encoding="utf-8") as file:
        file.write("\n".join([header, *lines]) + "\n")


def test_malformed_series_are_named(shared_data, tmp_path):
    with pytest.raises(ValueError, match="unknown series"):
        load_series("weather", shared_data)
    with pytest.raises(ValueError, match="unknown protocol"):
        split_series(load_series("etth1", shared_data), "random")
    row = ",".join(["1.0"] * 15)
    _write_jena(tmp_path, [f"2020-01-01 00:10:00,{row}", f"2020-01-01 00:20:00,{row}", f"2020-01-01 00:20:00,2{row}"])
    with pytest.raises(ForecastFormatError, match=rf"{JENA_FILE}:4: timestamp"):
        load_series("jena", tmp_path)
    _write_jena(tmp_path, [f"2020-01-01 00:10:00,{row}", f"2020-01-01 03:10:00,{row}"])
    with pytest.raises(ForecastFormatError, match=r":3: gap of 10800 s"):
        load_series("jena", tmp_path)
    _write_jena(tmp_path, [f"2020-01-01 00:10:00,{row}", f"2020-01-01 00:20:00,1.0,1.0,x,{row[8:]}"])
    with pytest.raises(ForecastFormatError, match=r":3: not a date and 14 numbers"):
        load_series("jena", tmp_path)
    with pytest.raises(ValueError, match="needs the first 25000"):
        split_series(load_series("etth1", shared_data), "paper")
