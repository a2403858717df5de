"""`task.split_seed` fixes the demos task's episode split while --seed varies the initialisation (issue #49), and
unset leaves the split and the fingerprint as --seed always drew them; metrics.json's "fit" records what the run
took (gradient steps, CPU-seconds, trainable parameters) and what stopped it."""

from __future__ import annotations

import json

import pytest
import torch

from drive import checkpoint
from drive.cli import main
from drive.learn import tasks
from drive.learn.tasks.demos import split_seeds

SPLITS = ("train_seeds", "val_seeds", "test_seeds")


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos") / "demos"
    assert main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-9", "--max-episode-steps",
                 "30", "--min-return", "0", "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    return out


def _fingerprint(demos, seed: int, **options: str):
    opts = tasks.options("demos", {"val_fraction": "0.2", **options})
    return tasks.load("demos", opts, demos, seed).fingerprint


def test_split_seed_fixes_the_split_and_none_is_the_split_seed_always_drew(demos):
    fixed = [_fingerprint(demos, seed, split_seed="7") for seed in (0, 1, 2)]
    assert all([fp[k] for k in SPLITS] == [fixed[0][k] for k in SPLITS] for fp in fixed)
    assert [fp["seed"] for fp in fixed] == [0, 1, 2] and all(fp["split_seed"] == 7 for fp in fixed)
    assert all(fp["options"]["split_seed"] == 7 for fp in fixed)
    episodes = sorted(int(e["seed"]) for e in json.loads((demos / "manifest.json").read_text())["episodes"])
    assert tuple(fixed[0][k] for k in SPLITS) == split_seeds(episodes, 0.2, 0.1, 7)
    for seed in (0, 1):  # unset: seed s draws the split, and the fingerprint has no trace of the option
        fp = _fingerprint(demos, seed)
        assert tuple(fp[k] for k in SPLITS) == split_seeds(episodes, 0.2, 0.1, seed)
        assert "split_seed" not in fp and "split_seed" not in fp["options"]
        assert list(fp)[-3:] == ["task", "options", "seed"]  # the keys, in the order tasks.load wrote them
    assert _fingerprint(demos, 0)["train_seeds"] != _fingerprint(demos, 1)["train_seeds"]


def test_runs_of_two_seeds_on_one_split_share_its_episodes_not_their_weights_and_record_their_cost(demos, tmp_path):
    common = ["--controller", "gmle", "--data", str(demos), "--epochs", "2", "--batch-size", "16", "--no-progress",
              "--set", "encoder.d_model=8", "n_heads=2", "task.val_fraction=0.2", "task.split_seed=3",
              "trainer.tensorboard=false", "trainer.patience=0"]  # fmt: skip
    runs = [tmp_path / f"seed{s}" for s in (0, 1)]
    for seed, run in enumerate(runs):
        assert main(["train", "--out", str(run), "--seed", str(seed), *common]) == 0
    saved = [checkpoint.read(run / "best.pt", kind="controller") for run in runs]
    assert [saved[0]["data"][k] for k in SPLITS] == [saved[1]["data"][k] for k in SPLITS]
    assert saved[0]["data"]["split_seed"] == saved[1]["data"]["split_seed"] == 3
    weights = [s["state_dict"] for s in saved]
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])  # another initialisation
    fit = json.loads((runs[0] / "metrics.json").read_text())["fit"]
    n_train = len(tasks.load("demos", tasks.options("demos", {"val_fraction": "0.2", "split_seed": "3"}), demos).train)
    assert fit["gradient_steps"] == 2 * -(-n_train // 16)  # one optimizer step per batch, two epochs
    assert fit["cpu_seconds"] > 0 and fit["n_trainable_parameters"] == fit["n_parameters"] > 0
    assert fit["max_epochs"] == 2 and fit["patience"] == 0 and fit["stopped_by"] == "cap"
