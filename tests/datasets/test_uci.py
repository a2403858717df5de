"""UCI loaders on the real files: shapes, Gal's index files used exactly, the NSAC protocol, train-only scalers."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from scipy.stats import norm

from datasets.uci import UCI_NAMES, Scaler, UCIFormatError, load_uci, n_splits, split

# rows, features, target name (PROVENANCE.md's table)
SHAPES = {
    "boston": (506, 13, "MEDV"),
    "concrete": (1030, 8, "CompressiveStrength_MPa"),
    "energy": (768, 8, "HeatingLoad"),
    "kin8nm": (8192, 8, "y"),
    "naval": (11934, 16, "kMc"),
    "power": (9568, 4, "PE"),
    "protein": (45730, 9, "RMSD"),
    "wine": (1599, 11, "quality"),
    "yacht": (308, 6, "ResiduaryResistance"),
}


@pytest.fixture(scope="module")
def sets(shared_data):
    return {name: load_uci(name, shared_data) for name in UCI_NAMES}


def _file_rows(data, kind, index):
    return np.loadtxt(data.folder / f"index_{kind}_{index}.txt").astype(np.int64)


def test_every_set_has_its_documented_shape(sets):
    assert set(sets) == set(SHAPES)
    for name, (rows, features, target) in SHAPES.items():
        data = sets[name]
        assert data.x.shape == (rows, features) and data.y.shape == (rows,)
        assert len(data.feature_names) == features and data.target_name == target
        assert n_splits(data, "gal") == (5 if name == "protein" else 20)
        assert n_splits(data, "nsac") == 5
    assert sets["wine"].y.min() == 3 and sets["wine"].y.max() == 8


@pytest.mark.parametrize("name", UCI_NAMES)
def test_gal_split_is_the_index_files_exactly(sets, name):
    data = sets[name]
    for index in (0, n_splits(data, "gal") - 1):
        s = split(data, "gal", index)
        file_train, file_test = _file_rows(data, "train", index), _file_rows(data, "test", index)
        np.testing.assert_array_equal(s.test_rows, file_test)
        np.testing.assert_array_equal(np.sort(np.r_[s.train_rows, s.val_rows]), np.sort(file_train))
        assert np.intersect1d(s.train_rows, s.val_rows).size == 0
        # Gal's experiment.py: the first int(0.8 n) training indices are fitted, the rest validate
        n_fit = int(0.8 * len(file_train))
        np.testing.assert_array_equal(s.train_rows, file_train[:n_fit])
        np.testing.assert_array_equal(s.val_rows, file_train[n_fit:])
        # the scaled parts hold exactly those rows
        np.testing.assert_allclose(s.x_scaler.inverse_transform(s.x_test), data.x[file_test], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(s.y_scaler.inverse_transform(s.y_val), data.y[s.val_rows], rtol=1e-5, atol=1e-6)
        assert s.x_train.dtype == np.float32 and s.x_train.shape == (n_fit, data.x.shape[1])


def test_gal_every_boston_split_and_seeded_validation(sets):
    data = sets["boston"]
    for index in range(20):
        np.testing.assert_array_equal(split(data, "gal", index).test_rows, _file_rows(data, "test", index))
    a, b = split(data, "gal", 3, val_seed=7), split(data, "gal", 3, val_seed=7)
    np.testing.assert_array_equal(a.val_rows, b.val_rows)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    other = split(data, "gal", 3, val_seed=8)
    assert not np.array_equal(np.sort(a.val_rows), np.sort(other.val_rows))
    assert not np.array_equal(np.sort(a.val_rows), np.sort(split(data, "gal", 3).val_rows))
    np.testing.assert_array_equal(np.sort(np.r_[a.train_rows, a.val_rows]), np.sort(_file_rows(data, "train", 3)))
    assert len(split(data, "gal", 3, val_fraction=0.1).val_rows) == 455 - int(455 * 0.9)
    with pytest.raises(ValueError, match="outside"):
        split(data, "gal", 20)


def test_nsac_split_reproduces_sklearn_train_test_split(sets):
    data = sets["boston"]
    s = split(data, "nsac", 0)
    assert s.seed == 42
    # sklearn train_test_split(X, y, test_size=..., random_state=42) on Boston: the widely published first test rows
    np.testing.assert_array_equal(s.test_rows[:5], [173, 274, 491, 72, 452])
    np.testing.assert_allclose(data.y[s.test_rows[:5]], [23.6, 32.4, 13.6, 22.8, 16.1])
    assert (len(s.train_rows), len(s.val_rows), len(s.test_rows)) == (409, 46, 51)  # Keras floor cut of 455
    assert np.union1d(np.r_[s.train_rows, s.val_rows], s.test_rows).size == 506
    tests = [set(split(data, "nsac", run).test_rows.tolist()) for run in range(5)]
    assert len({frozenset(t) for t in tests}) == 5
    # MinMax fitted on the fit rows: they span [0, 1] exactly
    assert s.x_scaler.kind == "minmax"
    np.testing.assert_allclose(s.x_train.min(axis=0), 0, atol=1e-7)
    np.testing.assert_allclose(s.x_train.max(axis=0), 1, atol=1e-6)
    np.testing.assert_allclose([s.y_train.min(), s.y_train.max()], [0, 1], atol=1e-6)


@pytest.mark.parametrize("protocol", ["gal", "nsac"])
def test_scalers_fit_on_train_rows_only(sets, protocol):
    data = sets["concrete"]
    s = split(data, protocol, 1)
    x, y = data.x.copy(), data.y.copy()
    changed = np.r_[s.val_rows, s.test_rows]
    x[changed] = x[changed] * 10 + 1000
    y[changed] = -y[changed]
    t = split(data._replace(x=x, y=y), protocol, 1)
    for a, b in ((s.x_scaler, t.x_scaler), (s.y_scaler, t.y_scaler)):
        np.testing.assert_array_equal(a.offset, b.offset)
        np.testing.assert_array_equal(a.scale, b.scale)
    np.testing.assert_array_equal(s.x_train, t.x_train)
    assert not np.allclose(s.x_test, t.x_test)
    rows = data.x[s.train_rows]
    if protocol == "gal":
        np.testing.assert_allclose(s.x_scaler.offset, rows.mean(axis=0))
        np.testing.assert_allclose(s.x_scaler.scale, rows.std(axis=0))
        np.testing.assert_allclose(s.x_train.mean(axis=0), 0, atol=1e-5)
    else:
        np.testing.assert_allclose(s.x_scaler.scale, rows.max(axis=0) - rows.min(axis=0))


def test_inverse_transform_round_trips_values_and_variances(sets):
    data = sets["power"]
    s = split(data, "gal", 0)
    np.testing.assert_allclose(s.y_scaler.inverse_transform(s.y_scaler.transform(data.y)), data.y, rtol=1e-12)
    scaled = s.y_scaler.transform(data.y[s.test_rows])
    np.testing.assert_allclose(s.y_scaler.inverse_var(scaled.var()), data.y[s.test_rows].var(), rtol=1e-10)
    # Gaussian NLL in original units = NLL in standardised units + log(scale): what reporting in original units needs
    rng = np.random.default_rng(0)
    mean, var = scaled + rng.normal(0, 0.1, scaled.shape), rng.uniform(0.01, 0.5, scaled.shape)
    nll_scaled = -norm.logpdf(scaled, mean, np.sqrt(var)).mean()
    nll_orig = -norm.logpdf(
        data.y[s.test_rows], s.y_scaler.inverse_transform(mean), np.sqrt(s.y_scaler.inverse_var(var))
    ).mean()
    np.testing.assert_allclose(nll_orig, nll_scaled + np.log(s.y_scaler.scale), rtol=1e-10)
    x_scaler = s.x_scaler
    np.testing.assert_allclose(x_scaler.inverse_transform(x_scaler.transform(data.x)), data.x, rtol=1e-12)
    np.testing.assert_allclose(x_scaler.column(2).inverse_var(4.0), 4.0 * x_scaler.scale[2] ** 2)


@pytest.mark.parametrize("protocol", ["gal", "nsac"])
def test_naval_constant_columns_scale_to_zero(sets, protocol):
    data = sets["naval"]
    s = split(data, protocol, 0)
    assert data.x[s.train_rows, 11].std() > 0  # numpy's std of a constant 0.998 is 1.9e-13: `std == 0` misses it
    for part in (s.x_train, s.x_val, s.x_test):
        assert np.isfinite(part).all()
        assert (part[:, [8, 11]] == 0).all()
    np.testing.assert_array_equal(s.x_scaler.scale[[8, 11]], 1.0)
    assert np.abs(s.x_train).max() < 10


def test_scaler_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        Scaler.fit("robust", np.ones((3, 2)))


def test_malformed_files_are_named(shared_data, tmp_path):
    with pytest.raises(ValueError, match="unknown UCI set"):
        load_uci("housing", shared_data)
    folder = tmp_path / "uci_gal" / "yacht" / "data"
    shutil.copytree(shared_data / "uci_gal" / "yacht" / "data", folder)
    data = load_uci("yacht", tmp_path)
    lines = (folder / "index_test_0.txt").read_text().splitlines()
    (folder / "index_test_0.txt").write_text("\n".join([lines[0], "308", *lines[2:]]) + "\n")
    with pytest.raises(UCIFormatError, match=r"index_test_0\.txt:2: 308\.0 is not a row"):
        split(data, "gal", 0)
    (folder / "index_test_1.txt").write_text("\n".join(lines[:1] * 2) + "\n")
    with pytest.raises(UCIFormatError, match=r"index_test_1\.txt: repeated"):
        split(data, "gal", 1)
    with (folder / "data.txt").open("a") as file:
        file.write("1 2 3\n")
    with pytest.raises(UCIFormatError, match=r"data\.txt"):
        load_uci("yacht", tmp_path)
