"""Task "forecast" on the real files: `drive train --task forecast` for every controller, windows, units, references."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
import torch

from datasets import forecast as fc
from drive.cli import main
from drive.errors import UserError
from drive.learn import tasks
from drive.learn.tasks import forecast as fc_task

REPORT_KEYS = ("mse", "rmse", "nll", "crps", "ece", "pit_w1", "coverage_90", "width_90")
SMALL = ("task.lookback=16", "task.horizon=4", "encoder.d_model=8", "trainer.tensorboard=0")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _build(root, seed=0, **options):
    return tasks.load("forecast", tasks.options("forecast", options), root, seed)


@pytest.mark.parametrize("controller", fc_task.CONTROLLERS)
def test_drive_train_writes_metrics_references_and_trajectories(shared_data, tmp_path, controller):
    out = tmp_path / controller
    argv = ["train", "--task", "forecast", "--controller", controller, "--out", str(out), "--data", str(shared_data),
            "--epochs", "1", "--no-progress", "--threads", "1", "--set", "task.dataset=jena", "task.protocol=authors",
            "task.plot_windows=2", *SMALL]  # fmt: skip
    if controller == "nsac":
        argv += ["n_heads=2"]
    assert main(argv) == 0
    report = json.loads((out / "metrics.json").read_text())
    test, original = report["test"], report["tests"]["original"]
    assert test["units"] == "scaled" and original["units"] == "original" and test["year"] == 2020 == original["year"]
    for key in REPORT_KEYS:
        assert math.isfinite(test[key]) and math.isfinite(original[key]), key
    assert set(test["references"]) == {"last_value", "seasonal", "train_mean"}
    assert test["beats_last_value"] == (test["mse"] < test["references"]["last_value"]["mse"])
    assert len(test["per_step_mse"]) == 4
    scale = fc.split_series(fc.load_series("jena", shared_data), "authors", 16, 4).target_scaler.scale
    assert original["mse"] == pytest.approx(test["mse"] * scale**2, rel=1e-6)
    ref, ref_orig = test["references"]["last_value"], original["references"]["last_value"]
    assert ref_orig["mse"] == pytest.approx(ref["mse"] * scale**2, rel=1e-6)
    with np.load(out / "trajectory.npz") as t:
        assert t["back"].shape == (2, 16) and t["mean"].shape == t["std"].shape == t["truth"].shape == (2, 4)
    assert (out / "forecast.png").is_file()


def test_windows_residual_targets_and_chronology(shared_data):
    data = _build(shared_data, dataset="ettm1", protocol="paper")
    part = fc.split_series(fc.load_series("ettm1", shared_data), "paper")
    for windows, split, (start, stop) in ((data.train, part.train, part.train_rows), (data.val, part.val,
                                          part.val_rows), (data.test, part.test, part.test_rows)):  # fmt: skip
        assert windows.t[0] - 48 == start and windows.t[-1] + 24 < stop  # look-back and targets inside the split
        level = windows.tensors[1].double().numpy() + windows.last  # residual + last value = the scaled steps
        np.testing.assert_allclose(level, split.y, atol=1e-6)
        np.testing.assert_array_equal(windows.last[:, 0], part.scaled[windows.t - 1, -1])
    assert data.train.t[-1] + 24 <= data.val.t[0] - 48 and data.val.t[-1] + 24 <= data.test.t[0] - 48
    level = _build(shared_data, dataset="ettm1", protocol="paper", target="level")
    np.testing.assert_array_equal(level.test.tensors[1].numpy(), part.test.y)
    assert data.encoder.kind == "sequence" and data.encoder.n_tokens == 48 and data.out_dim == 24


def test_standardiser_is_fitted_on_training_rows_only(shared_data, tmp_path):
    """Rewriting every row after ETTm1's training part leaves the task's scaler and training windows unchanged."""
    before = _build(shared_data, dataset="ettm1", protocol="paper")
    src = shared_data / "ett" / "ETTm1.csv.gz"
    with gzip.open(src, "rt") as fh:
        lines = fh.read().splitlines()[: 1 + 25_000]  # the paper protocol reads the first 25,000 rows
    for i in range(1 + before.fingerprint["rows"][0][1], len(lines)):  # header + train rows kept
        date, *values = lines[i].split(",")
        lines[i] = ",".join([date, *(f"{float(v) * 3 + 50:.3f}" for v in values)])
    (tmp_path / "ett").mkdir()
    with gzip.open(tmp_path / "ett" / "ETTm1.csv.gz", "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    after = _build(tmp_path, dataset="ettm1", protocol="paper")
    for key in ("offset", "scale"):
        np.testing.assert_array_equal(after.standardiser[key], before.standardiser[key])
    torch.testing.assert_close(after.train.tensors[0], before.train.tensors[0])
    assert not torch.allclose(after.test.tensors[0], before.test.tensors[0])


def test_bad_options_are_one_line_errors(shared_data):
    with pytest.raises(UserError, match="unknown dataset"):
        _build(shared_data, dataset="weather")
    with pytest.raises(UserError, match="informer protocol is defined for ETT only"):
        _build(shared_data, dataset="jena", protocol="informer")


def test_paper_numbers_are_the_issues():
    assert fc_task.PAPER["paper"]["ettm1"]["nsac"] == {"mse": 0.0099, "nll": -1.3816, "crps": 0.1037, "ece": 0.3970}
    assert fc_task.PAPER["paper"]["ettm1"]["de"]["mse"] == 0.0059
    assert fc_task.PAPER["paper"]["jena"]["nsac"] == {"mse": 0.1675, "nll": -1.9114, "crps": 0.1422}
