"""`drive ood` on the shipped NSAC in a clone that lacks its data: one line naming the `drive collect` command that
regenerates the test episodes, and `--data DIR` with them regenerated scores the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drive import checkpoint
from drive.cli import main

NSAC = Path(__file__).resolve().parents[3] / "checkpoints" / "carracing_nsac.pt"
pytestmark = pytest.mark.skipif(not NSAC.exists(), reason="the shipped checkpoint is absent")


def test_ood_names_the_regeneration_and_runs_on_the_regenerated_episodes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the fingerprint's relative data folder does not exist here
    out = tmp_path / "ood.json"
    assert main(["ood", "--ckpt", str(NSAC), "--out", str(out), "--max-episodes", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "drive collect --expert pursuit --action-noise 0.15" in err
    first = checkpoint.read(NSAC, kind="controller")["data"]["test_seeds"][0]
    data = tmp_path / "regen"
    assert main(["collect", "--expert", "pursuit", "--action-noise", "0.15", "--frame-coding", "full", "--seeds",
                 str(first), "--out", str(data), "--no-progress"]) == 0  # fmt: skip
    assert main(["ood", "--ckpt", str(NSAC), "--out", str(out), "--data", str(data), "--max-episodes", "1",
                 "--perturb", "noise:0.1", "--every", "50"]) == 0  # fmt: skip
    result = json.loads(out.read_text())
    assert set(result["controllers"]["nsac"]) >= {"noise:0.1"} and result["n_clean"] > 0


def test_sa_calibrate_names_the_regeneration_too(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["sa", "calibrate", "--ckpt", str(NSAC), "--out", str(tmp_path / "sa"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "drive collect --expert pursuit" in err and "--data DIR" in err
    assert main(["sa", "calibrate", "--ckpt", str(NSAC), "--out", str(tmp_path / "sa"), "--no-progress",
                 "--data", str(tmp_path / "empty")]) == 2  # fmt: skip
    assert str(tmp_path / "empty") in capsys.readouterr().err


def test_every_checkpoint_keeps_its_own_row_when_controllers_share_a_name():
    """Three NSAC variants of one seed differ only two folders up: each gets its own row, none overwrites another."""
    from drive.studies.ood.study import _unique

    taken: dict[str, int] = {}
    for path in ["b/nsac/seed2/best.pt", "b/nsac-fit/seed2/best.pt", "b/nsac-fit-0.3/seed2/best.pt", "best.pt"]:
        taken[_unique("nsac", Path(path), taken)] = 1
    assert list(taken) == ["nsac", "nsac:seed2", "nsac:nsac-fit-0.3/seed2", "nsac#2"]
