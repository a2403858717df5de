"""Task "bearings" (the NSAC bearing experiment) on the staged feature files: splits, scalings, references, every
controller with and without Time, metrics.json keys, plots, and `drive bench offline --task bearings`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from agents.registry import CONTROLLERS
from datasets.bearings import PAPER_TESTS, TRAIN, nsac_split, read_feature_csv, staged_files
from datasets.bearings.protocol import Standardiser
from drive.cli import main
from drive.learn import tasks
from drive.learn.tasks import bearings

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ("task.bearings=paper", "task.subsample=40", "encoder.d_model=8", "n_heads=2", "trainer.val_samples=2",
        "task.eval_samples=2")  # fmt: skip


def _load(shared_data, **options):
    opts = tasks.options("bearings", {k: str(v) for k, v in options.items()})
    return tasks.load("bearings", opts, shared_data, 0)


def test_nsac_protocol_sizes_inputs_and_seed(shared_data):
    data = _load(shared_data, bearings="paper")
    assert (len(data.train), len(data.val)) == (22680, 2520)  # 90 % of 28,000, of which Keras' last 10 % validates
    assert data.encoder.in_dim == 16 and data.fingerprint["paper_seed"] == 42
    assert data.fingerprint["feature_names"][-2:] == ["Time", "Temperature"]
    no_time = _load(shared_data, bearings="paper", protocol="no_time")
    assert no_time.encoder.in_dim == 15 and "Time" not in no_time.fingerprint["feature_names"]
    # the pooled test split is the paper's three bearings, in order
    assert len(data.test) == 8000 + 4663 + 12387
    split = nsac_split(42, tables={n: read_feature_csv(p, n) for n, p in staged_files(shared_data).items()
                                   if n in (*TRAIN, *PAPER_TESTS)})  # fmt: skip
    assert torch.equal(data.train.tensors[0], torch.from_numpy(split.x_train[:22680]).float())
    assert torch.equal(data.val.tensors[1][:, 0], torch.from_numpy(split.y_train[22680:]).float())
    assert _load(shared_data, bearings="paper").fingerprint["files_sha256"] == data.fingerprint["files_sha256"]


def test_scalings_references_labels_and_metrics_keys(shared_data):
    data = _load(shared_data, bearings="all", subsample=10)
    model = CONTROLLERS["gmle"](encoder=data.encoder, out_dim=1).build().eval()
    out = data.evaluate(model)
    assert set(out) >= {"test", "tests", "heldout", "protocol"}
    names = list(out["tests"])
    assert names[:3] == list(PAPER_TESTS) and names[-3:] == [f"{n}@per_bearing" for n in PAPER_TESTS]
    assert len(names) == len(staged_files(shared_data)) - 3 + 1 + 3  # every staged bearing not trained on (+1_1)
    assert out["tests"]["pronostia/Bearing1_3"]["label"] == "Degradation_monotonic"
    assert out["tests"]["pronostia/Bearing2_1"]["label"] == "Degradation"
    for report in out["tests"].values():
        assert {"mse", "nll", "crps", "ece", "pit_w1", "coverage_90", "width_90"} <= set(report)
        assert set(report["references"]) == {"train_mean", "life_fraction"}
    refs = {n: r["references"]["life_fraction"]["mse"] for n, r in out["tests"].items()}
    assert refs["xjtu/Bearing1_1"] < 1e-4 and abs(refs["hust/Bearing1"] - 0.2590) < 5e-3  # HUST's label is linear
    table = read_feature_csv(staged_files(shared_data)["pronostia/Bearing2_1"])
    refit = Standardiser.fit(table.inputs()).transform(table.inputs())[::10]
    pred = bearings._predict(model, refit, bearings.Options(), 0)
    assert np.isclose(out["tests"]["pronostia/Bearing2_1@per_bearing"]["mse"],
                      float(((pred.mean[:, 0].numpy() - table.label[::10]) ** 2).mean()), rtol=1e-6)  # fmt: skip


def test_paper_keys_name_tables_the_benchmark_builds(shared_data):
    data = _load(shared_data, bearings="paper", subsample=50)
    model = CONTROLLERS["gmle"](encoder=data.encoder, out_dim=1).build().eval()
    names = {f"bearings/{n}" for n in data.evaluate(model)["tests"]}
    assert set(bearings.PAPER["time"]) <= names
    assert bearings.PAPER["time"]["bearings/xjtu/Bearing1_1@per_bearing"]["nsac"]["mse"] == 0.0048


FAST = {("gmle", "time"), ("nsac", "no_time")}  # the default suite; the rest carry the slow marker
GRID = [pytest.param(c, p, marks=() if (c, p) in FAST else pytest.mark.slow)
        for c in bearings.CONTROLLERS for p in bearings.PROTOCOLS]  # fmt: skip


@pytest.mark.parametrize(("controller", "protocol"), GRID)
def test_every_controller_trains_and_reports(shared_data, tmp_path, controller, protocol):
    out = tmp_path / "run"
    argv = ["train", "--task", "bearings", "--controller", controller, "--out", str(out), "--epochs", "1",
            "--data", str(shared_data), "--no-progress", "--set", f"task.protocol={protocol}", *TINY]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((out / "metrics.json").read_text())
    assert report["task"] == "bearings" and set(PAPER_TESTS) <= set(report["tests"])
    assert np.isfinite([report["test"]["mse"], report["heldout"]["crps"]]).all()
    assert (out / "bearings.png").stat().st_size > 10_000 and report["plots"] == ["bearings.png"]
    with np.load(out / "tubes.npz") as tubes:
        assert f"{PAPER_TESTS[1]}/epistemic_var" in tubes.files and f"{PAPER_TESTS[2]}@per_bearing/x" in tubes.files
        assert len(tubes[f"{PAPER_TESTS[0]}/mean"]) == len(range(0, 8000, 40))
    with np.load(out / "predictions.npz") as pred:
        assert pred["mean"].shape == (len(range(0, 8000, 40)) + len(range(0, 4663, 40)) + len(range(0, 12387, 40)), 1)


def test_bench_offline_tables_paper_numbers_and_tube_figure(shared_data, tmp_path):
    out = tmp_path / "bench"
    argv = ["bench", "offline", "--task", "bearings", "--controllers", "gmle", "nsac", "--seeds", "1", "--epochs",
            "1", "--data", str(shared_data), "--no-progress", "--out", str(out), "--set", *TINY]  # fmt: skip
    assert main(argv) == 0
    text = (out / "results.md").read_text()
    assert "### bearings/pronostia/Bearing2_1@per_bearing" in text and "[paper 0.031]" in text
    assert (out / "plots" / "bearings_tubes.png").stat().st_size > 10_000
    results = json.loads((out / "results.json").read_text())
    keys = [t["key"] for t in results["tables"]]
    assert keys[:4] == ["bearings", *(f"bearings/{n}" for n in PAPER_TESTS)]
    life = next(t for t in results["tables"] if t["key"] == "bearings/hust/Bearing1")["references"]
    assert {r["row"] for r in life} == {"train_mean", "life_fraction"}
