"""Rerunning a `drive train` command continues its run, as `drive collect` continues its dataset: a finished run
says so and prints its summary, an interrupted one continues exactly as `--resume` does, and another command on the
same --out is refused, naming what differs (drive/learn/experiment.py check_resume)."""

from __future__ import annotations

import json

import pytest
import torch

from drive import checkpoint
from drive.cli import main
from drive.learn import trainer

TINY = ["--controller", "gmle", "--task", "spiral", "--no-progress", "--set", "task.n_obs=5", "task.n_freqs=2",
        "encoder.d_model=8", "n_heads=2", "trainer.tensorboard=false"]  # fmt: skip


def _rows(run) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def test_rerunning_a_finished_run_prints_its_summary_and_another_command_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    command = ["train", "--out", str(run), "--epochs", "1", *TINY]
    assert main(command) == 0
    first = capsys.readouterr().out
    kept = {name: (run / name).read_bytes() for name in ("best.pt", "resume.pt", "metrics.json", "metrics.jsonl")}

    assert main(command) == 0  # the same command again: nothing to train, the summary as the run left it
    out = capsys.readouterr().out
    assert f"{run}: the run is complete (1 epochs); nothing to train" in out and "training gmle" not in out
    summary = first[first.index("gmle on spiral") :]
    assert out.endswith(summary) and "best epoch 1 of 1 (selected on val nll " in summary
    assert {name: (run / name).read_bytes() for name in kept} == kept

    other = [a.replace("task.n_obs=5", "task.n_obs=7") for a in command]  # no --resume: refused all the same
    assert main(other) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"drive train: error: {run} holds a run with other settings than this command ")
    assert "(data.options.n_obs, data.recipe.n_obs)" in err and "--resume-with-changes" in err
    assert {name: (run / name).read_bytes() for name in kept} == kept

    assert main([*command[:4], "2", *TINY]) == 0  # more epochs: the finished run goes on, and says so
    assert [r["epoch"] for r in _rows(run)] == [1, 2]
    out = capsys.readouterr().out
    assert f"{run}: the run finished 1 epochs; --epochs 2 extends it" in out
    assert f"{run}: resuming at epoch 2 of 2 (1 finished; best val_nll " in out


def test_rerunning_an_interrupted_run_continues_it_exactly(tmp_path, capsys, monkeypatch):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(["train", "--out", str(straight), "--epochs", "2", *TINY]) == 0

    original = trainer._train_epoch

    def interrupted_in_epoch_2(model, train, optimizer, scheduler, cfg, epoch):
        if epoch == 2:
            raise KeyboardInterrupt  # Ctrl-C after the first epoch finished
        return original(model, train, optimizer, scheduler, cfg, epoch)

    monkeypatch.setattr(trainer, "_train_epoch", interrupted_in_epoch_2)
    command = ["train", "--out", str(killed), "--epochs", "2", *TINY]
    assert main(command) == 130
    assert [r["epoch"] for r in _rows(killed)] == [1] and not (killed / "metrics.json").exists()
    monkeypatch.setattr(trainer, "_train_epoch", original)
    err = capsys.readouterr().err
    assert err == "drive train: interrupted; rerun the same command to continue (what finished is kept)\n"

    assert main(command) == 0  # rerun, no --resume
    out = capsys.readouterr().out
    assert "the run is complete" not in out and f"{killed}: resuming at epoch 2 of 2 (1 finished;" in out
    assert _rows(killed) == _rows(straight)
    ours = checkpoint.read(killed / "best.pt", kind="controller")["state_dict"]
    theirs = checkpoint.read(straight / "best.pt", kind="controller")["state_dict"]
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    report = json.loads((killed / "metrics.json").read_text())
    assert report["val"] == json.loads((straight / "metrics.json").read_text())["val"]
    assert report["fit"]["epochs_run"] == 2
    straight_fit = json.loads((straight / "metrics.json").read_text())["fit"]  # the cost counts both sessions
    assert report["fit"]["gradient_steps"] == straight_fit["gradient_steps"] > 0 and report["fit"]["cpu_seconds"] > 0


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    """Six short fake-road episodes of frames: what a controller of frames (NSAC, the ensemble) trains on."""
    out = tmp_path_factory.mktemp("demos") / "demos"
    assert main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-5", "--max-episode-steps",
                 "60", "--min-return", "0", "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    return out


@pytest.mark.parametrize("controller", ["nsac", "de"])
def test_a_controller_of_frames_interrupted_mid_run_resumes_to_the_same_bytes(demos, tmp_path, capsys, monkeypatch,
                                                                               controller):  # fmt: skip
    """NSAC's validation draws from the global RNG (its frame path); the resume state is taken after it, so a run
    interrupted in epoch 2 and rerun writes the uninterrupted run's bytes; the ensemble's members likewise."""
    command = ["train", "--controller", controller, "--data", str(demos), "--out", "run", "--epochs", "3",
               "--batch-size", "16", "--no-progress", "--set", "encoder.d_model=8", "n_heads=2",
               "trainer.tensorboard=false"]  # fmt: skip
    (tmp_path / "straight").mkdir()
    (tmp_path / "killed").mkdir()
    monkeypatch.chdir(tmp_path / "straight")
    assert main(command) == 0
    original = trainer._train_epoch

    def interrupted_in_epoch_2(model, train, optimizer, scheduler, cfg, epoch):
        if epoch == 2:
            optimizer.step = lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt)  # mid-epoch, after a batch
        return original(model, train, optimizer, scheduler, cfg, epoch)

    monkeypatch.chdir(tmp_path / "killed")
    monkeypatch.setattr(trainer, "_train_epoch", interrupted_in_epoch_2)
    assert main(command) == 130
    monkeypatch.setattr(trainer, "_train_epoch", original)
    assert main(command) == 0
    assert "resuming at epoch 2 of 3" in capsys.readouterr().out
    straight, killed = tmp_path / "straight" / "run", tmp_path / "killed" / "run"
    assert _rows(killed) == _rows(straight)
    for name in ("best.pt", "last.pt"):
        ours = checkpoint.read(killed / name, kind="controller")["state_dict"]
        theirs = checkpoint.read(straight / name, kind="controller")["state_dict"]
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours), name
        assert (killed / name).read_bytes() == (straight / name).read_bytes(), name
