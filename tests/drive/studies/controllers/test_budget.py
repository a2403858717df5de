"""The converged protocol of `drive bench controllers` (issue #49): --patience and --split-seeds reach every row's
`drive train` command (and without them the commands are today's), and each run's cost and convergence are recorded:
budget.json / budget.md per row and seed (steps, CPU-s, parameters; a run that hit the cap flagged "not converged")
and one learning-curve figure per row; several splits give the split's share of the spread."""

from __future__ import annotations

import json

import pytest

from drive.cli import main
from drive.commands.bench import controllers as command
from drive.errors import UserError
from drive.studies.controllers import budget
from drive.studies.offline import grid as offline


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("budget") / "demos"
    assert main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-7", "--max-episode-steps",
                 "30", "--min-return", "0", "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    return out


def test_the_options_reach_every_rows_command_and_the_defaults_keep_todays(tmp_path):
    today = command.Config(data=tmp_path, out=tmp_path / "b")
    assert command.overrides(today, None) == command.BUDGET and command.splits(today) == [(None, tmp_path / "b")]
    cfg = command.Config(data=tmp_path, out=tmp_path / "b", patience=4, split_seeds=(0, 1))
    assert command.overrides(cfg, 1) == ("task.stride=4", "n_heads=4", "trainer.patience=4", "task.split_seed=1")
    assert command.splits(cfg) == [(0, tmp_path / "b" / "split0"), (1, tmp_path / "b" / "split1")]
    one = command.Config(data=tmp_path, out=tmp_path / "b", split_seeds=(5,))
    assert command.splits(one) == [(5, tmp_path / "b")]
    with pytest.raises(UserError, match="--split-seeds 1 1"):
        command.splits(command.Config(data=tmp_path, out=tmp_path, split_seeds=(1, 1)))


def test_each_run_records_its_steps_cpu_seconds_parameters_and_a_run_at_the_cap_is_flagged(demos, tmp_path):
    out = tmp_path / "bench"
    sets = ("encoder.d_model=8", "n_heads=2", "task.val_fraction=0.2", "task.stride=2", "trainer.tensorboard=false",
            "trainer.patience=0", "task.split_seed=0")  # fmt: skip
    grid = offline.make_grid("demos", controllers=("gmle", "de"), seeds=2, out=out, data=str(demos), epochs=2,
                             overrides=sets)  # fmt: skip
    offline.run_grid(grid, progress=False)
    paths = budget.write(out, grid)
    assert paths == [out / "budget.json", out / "budget.md", out / "curves" / "gmle.png", out / "curves" / "de.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    made = json.loads((out / "budget.json").read_text())
    for row in ("gmle", "de"):
        runs = made["rows"][row]["runs"]
        assert [r["seed"] for r in runs] == [0, 1] and made["rows"][row]["not_converged"] == 2
        for r in runs:
            assert r["gradient_steps"] > 0 and r["cpu_seconds"] > 0 and r["n_parameters"] > 0
            assert r["epochs_run"] == r["max_epochs"] == 2 and r["stopped_by"] == "cap" and not r["converged"]
            assert r["curve"]["epoch"] == [1, 2] and len(r["curve"]["train_loss"]) == len(r["curve"]["val_mse"]) == 2
    gmle, de = (made["rows"][r]["runs"][0] for r in ("gmle", "de"))
    assert de["gradient_steps"] == gmle["gradient_steps"]  # the same data and epochs: the same steps
    assert de["n_parameters"] > 4 * gmle["n_parameters"]  # five members
    text = (out / "budget.md").read_text()
    assert "| gmle | 2 | 2.0 (2) | " in text and "0 of 2 (2 not converged)" in text
    assert f"{gmle['gradient_steps']:,} steps · " in text and "cap: **not converged**" in text


def test_a_run_stopped_by_patience_is_converged_and_the_split_share_separates_split_from_seed():
    def run(seed: int, stopped: str) -> dict:
        curve = {"epoch": [1, 2, 3], "train_loss": [1.0, 0.5, 0.4], "val_mse": [0.3, 0.2, 0.25]}
        return {"row": "nsac", "seed": seed, "epochs_run": 3, "max_epochs": 50, "best_epoch": 2, "patience": 1,
                "stopped_by": stopped, "converged": stopped == "patience", "gradient_steps": 30, "cpu_seconds": 2.5,
                "train_seconds": 3.0, "n_parameters": 1000, "select": "val_mse", "curve": curve}  # fmt: skip

    runs = [run(0, "patience"), run(1, "patience")]
    mean = {"epochs_run": 3.0, "best_epoch": 2.0, "gradient_steps": 30.0, "cpu_seconds": 2.5, "train_seconds": 3.0,
            "n_parameters": 1000.0}  # fmt: skip
    made = {"rows": {"nsac": {"runs": runs, "not_converged": 0, "mean": mean}}}
    text = budget.markdown(made)
    assert "| nsac | 2 | 3.0 (50) | 2.0 | 2 of 2 | 30 steps · 2 CPU-s · 1,000 |" in text
    assert "not converged**" not in text
    by_split = {s: {"rows": {"nsac": {"clean return": {"values": values}}}}
                for s, values in ((0, [100.0, 102.0, 98.0]), (1, [200.0, 202.0, 198.0]))}  # fmt: skip
    share = budget.split_share(by_split)["rows"]["nsac"]["clean return"]
    assert share["mean_per_split"] == {"0": 100.0, "1": 200.0} and share["sd_within_split"] == pytest.approx(2.0)
    assert share["split_share"] == pytest.approx(5000.0 / 5004.0)
    assert "| nsac | clean return | 0: 100, 1: 200 | 2 | 70.7 | 100% |" in budget.split_markdown(
        budget.split_share(by_split), "drive bench controllers"
    )
