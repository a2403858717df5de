"""`drive monitor train`: SelfOracle trained on a dataset's frames, written as a checkpoint of kind "monitor" that the
benchmark loads and that no controller command mistakes for a controller."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from datasets.demonstrations import Demonstrations
from drive import checkpoint
from drive.cli import main


def test_selforacle_trains_on_the_frames_and_is_a_monitor_checkpoint(tmp_path, capsys):
    data = tmp_path / "demos"
    assert main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-1", "--out", str(data),
                 "--max-episode-steps", "40", "--min-return", "-1000", "--no-progress"]) == 0  # fmt: skip
    out = tmp_path / "so.pt"
    assert main(["monitor", "train", "--data", str(data), "--out", str(out), "--epochs", "2", "--stride", "1"]) == 0
    monitor, payload = checkpoint.load_monitor(out)
    assert payload["kind"] == "monitor" and payload["data"]["n_frames"] == 80 and len(payload["metrics"]["loss"]) == 2
    assert not str(payload["data"]["path"]).startswith("/")  # no path of this machine
    frames = torch.as_tensor(np.concatenate([e.frames[3:] for e in Demonstrations(data)]))  # (80, 84, 84)
    assert monitor.score(frames).mean() < monitor.score(255 - frames).mean()  # its own frames reconstruct better
    with pytest.raises(checkpoint.CheckpointError, match="misbehaviour monitor"):
        checkpoint.load_controller(out)
    capsys.readouterr()
    assert main(["monitor", "train", "--data", str(tmp_path / "none"), "--out", str(out)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
