"""Task "uci" on the real files: `drive train --task uci` for every controller, seeds as splits, both units."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from agents.base import Prediction
from datasets import uci
from drive.cli import main
from drive.errors import UserError
from drive.learn import tasks
from drive.learn.tasks import uci as uci_task
from drive.learn.tasks.scoring import constant_gaussian_report, rescaled

CONTROLLERS = uci_task.CONTROLLERS
REPORT_KEYS = ("mse", "rmse", "nll", "crps", "ece", "pit_w1", "coverage_90", "width_90")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _build(shared_data, seed=0, **options):
    return tasks.load("uci", tasks.options("uci", options), shared_data, seed)


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_drive_train_writes_metrics_in_both_units(shared_data, tmp_path, controller):
    out = tmp_path / controller
    argv = ["train", "--task", "uci", "--controller", controller, "--out", str(out), "--data", str(shared_data),
            "--epochs", "1", "--seed", "1", "--no-progress", "--threads", "1", "--set", "task.dataset=yacht",
            "task.protocol=gal", "encoder.d_model=8", "trainer.tensorboard=0"]  # fmt: skip
    if controller == "nsac":
        argv += ["n_heads=2"]
    assert main(argv) == 0
    report = json.loads((out / "metrics.json").read_text())
    test, scaled = report["test"], report["tests"]["scaled"]
    assert test["units"] == "original" and scaled["units"] == "scaled" and test["n"] == 31  # yacht: 308 rows, 10 %
    for key in REPORT_KEYS:
        assert math.isfinite(test[key]) and math.isfinite(scaled[key]), key
    assert report["fit"]["train_seconds"] > 0 and report["fit"]["eval_seconds"] > 0
    # the same predictive in two units: RMSE scales by y's std, NLL shifts by its log, calibration is unit-free
    y_scale = uci.split(uci.load_uci("yacht", shared_data), "gal", 1).y_scaler.scale
    assert test["rmse"] == pytest.approx(scaled["rmse"] * y_scale, rel=1e-6)
    assert test["nll"] == pytest.approx(scaled["nll"] + math.log(y_scale), rel=1e-6, abs=1e-6)
    assert test["ece"] == pytest.approx(scaled["ece"], abs=1e-9)
    assert set(test["references"]) == {"train_mean"}
    assert (out / "predictions.npz").is_file()


def test_run_seed_is_the_protocols_split(shared_data):
    table = uci.load_uci("boston", shared_data)
    gal = _build(shared_data, seed=3, dataset="boston", protocol="gal")
    rows = np.loadtxt(table.folder / "index_test_3.txt").astype(int)
    np.testing.assert_allclose(gal.test.tensors[0].numpy(), uci.split(table, "gal", 3).x_test)
    assert gal.fingerprint["split_index"] == 3 and gal.fingerprint["n_test"] == len(rows)
    nsac = _build(shared_data, seed=2, dataset="boston", protocol="nsac")
    assert nsac.fingerprint["split_seed"] == 44  # run 2 = the paper's seed 44
    with pytest.raises(UserError, match="outside the gal runs of protein"):
        _build(shared_data, seed=5, dataset="protein", protocol="gal")
    with pytest.raises(UserError, match="unknown dataset"):
        _build(shared_data, dataset="housing")
    assert uci_task.n_runs("protein", "gal", shared_data) == 5 and uci_task.n_runs("boston", "nsac", shared_data) == 5


@pytest.mark.parametrize("protocol", ["gal", "nsac"])
def test_standardiser_is_fitted_on_training_rows_only(shared_data, tmp_path, protocol):
    """Changing every test row of the file leaves the task's scalers and training data unchanged."""
    before = _build(shared_data, seed=1, dataset="yacht", protocol=protocol)
    root = tmp_path / "root"
    shutil.copytree(shared_data / "uci_gal" / "yacht", root / "uci_gal" / "yacht")
    path = root / "uci_gal" / "yacht" / "data" / "data.txt"
    data = np.loadtxt(path)
    test_rows = uci.split(uci.load_uci("yacht", shared_data), protocol, 1).test_rows
    data[test_rows] = data[test_rows] * 7 + 100
    np.savetxt(path, data)
    after = _build(root, seed=1, dataset="yacht", protocol=protocol)
    for key in ("x_offset", "x_scale", "y_offset", "y_scale"):
        np.testing.assert_array_equal(after.standardiser[key], before.standardiser[key])
    torch.testing.assert_close(after.train.tensors[0], before.train.tensors[0])
    assert not torch.allclose(after.test.tensors[1], before.test.tensors[1])


def test_rescaled_and_train_mean_reference_against_hand_computation():
    rng = np.random.default_rng(0)
    mean, var, y = rng.normal(size=(50, 1)), rng.uniform(0.1, 1, (50, 1)), rng.normal(size=(50, 1))
    pred = Prediction(torch.tensor(mean), torch.tensor(var * 0.7), torch.tensor(var * 0.3))
    p, t = rescaled(pred, torch.tensor(y), 3.0, 2.0)
    np.testing.assert_allclose(p.mean.numpy(), mean * 2 + 3)
    np.testing.assert_allclose(p.total_var.numpy(), var * 4)
    np.testing.assert_allclose(t.numpy(), y * 2 + 3)
    ref = constant_gaussian_report(0.5, 2.0, y)
    assert ref["mse"] == pytest.approx(np.mean((y - 0.5) ** 2))
    nll = np.mean(0.5 * np.log(2 * np.pi * 4.0) + (y - 0.5) ** 2 / 8.0)
    assert ref["nll"] == pytest.approx(nll)


def test_paper_numbers_are_the_issues():
    assert uci_task.PAPER["nsac"]["boston"]["nsac"] == {"mse": 0.030, "nll": -0.2665, "crps": 0.0940, "ece": 0.3974}
    assert uci_task.PAPER["nsac"]["kin8nm"]["nsac"]["nll"] == -0.3870
    assert uci_task.PAPER["gal"]["naval"]["de"] == {"rmse": 0.00, "nll": -5.63}
    assert set(uci_task.PAPER["gal"]) == set(uci_task.DATASETS)
