"""`drive demo`, the README's main job, on short episodes: the shipped expert records, the shipped NSAC controller
drives an unseen track with the recorder on, and both videos, the trace and its plots are written."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from drive import checkpoint
from drive.cli import main
from drive.loop import evaluate
from drive.loop.options import SHIPPED_CONTROLLER
from drive.observe.trace import read_trace
from drive.observe.video import read_video

STEPS = 40


def test_the_shipped_controller_is_a_trained_nsac_that_loads():
    ckpt = checkpoint.read(SHIPPED_CONTROLLER, kind="controller")
    assert ckpt["name"] == "nsac"
    assert ckpt["config"]["out_dim"] == 3  # steering, gas, brake
    model, _ = checkpoint.load_controller(SHIPPED_CONTROLLER)
    assert float(model.y_scale.min()) < 1.0  # fitted target statistics travel with the weights (not the defaults)


def test_demo_records_the_expert_and_replays_the_controller(tmp_path, capsys, monkeypatch):
    def no_nominal_laps(*args, **kwargs):
        raise AssertionError("the demo ran failure prediction (5 nominal laps) on its one lap")

    monkeypatch.setattr(evaluate, "_failure_prediction", no_nominal_laps)
    out = tmp_path / "demo"
    args = ["demo", "--out", str(out), "--episodes", "1", "--workers", "1", "--max-episode-steps", str(STEPS),
            "--video-steps", "25", "--track", "1003", "--no-progress"]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    # what a newcomer reads: the steps and where every output is; no raw dict, no metric meaningless on one lap
    assert "step 1/2" in printed and "step 2/2" in printed
    for output in ("demonstrations", "expert.mp4", "trace/trace_seed001003.parquet", "controller.mp4",
                   "trace/trace_seed001003_map.png", "trace/trace_seed001003_timeseries.png"):  # fmt: skip
        assert str(out / output) in printed, output
    assert "AUROC" not in printed and "{" not in printed and " - " not in printed
    assert len(read_video(out / "expert.mp4")) == 25
    table, meta = read_trace(out / "trace" / "trace_seed001003.parquet")
    assert table.num_rows == STEPS and meta["seed"] == 1003
    assert meta["policy"].startswith("ckpt:") and not Path(meta["policy"][5:]).is_absolute()  # no path of this machine
    for column in ("kappa", "phi", "psi", "mean_steer", "epistemic_var_steer", "expert_steer"):
        values = table.column(column).to_numpy(zero_copy_only=False)
        assert np.isfinite(values).all(), column
    assert sorted(p.name for p in (out / "trace").glob("*.png")) == [
        "trace_seed001003_map.png",
        "trace_seed001003_timeseries.png",
    ]
    assert len(read_video(out / "controller.mp4")) == STEPS // 2  # every 2nd step
    # rerunning resumes the recording and drives again (nothing lost, nothing duplicated)
    assert main(args) == 0
    assert len(list((out / "demonstrations").rglob("*.npz"))) == 1


def test_demo_with_a_missing_controller_fails_clearly(tmp_path, capsys):
    code = main(["demo", "--out", str(tmp_path / "d"), "--episodes", "1", "--workers", "1", "--max-episode-steps",
                 "20", "--video-steps", "5", "--ckpt", str(tmp_path / "nope.pt"), "--no-progress"])  # fmt: skip
    assert code == 2
    assert "nope.pt" in capsys.readouterr().err
    assert not (tmp_path / "d" / "demonstrations").exists()  # it failed before recording anything
