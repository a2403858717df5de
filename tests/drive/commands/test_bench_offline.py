"""`drive bench offline` on a tiny grid: tables, plots, the paper's numbers, resume keeps finished cells."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from drive.cli import main
from drive.errors import UserError
from drive.studies.offline import grid as offline
from drive.studies.offline import plots as report_plots

SETS = ("task.dataset=yacht", "encoder.d_model=8", "trainer.tensorboard=0")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _bench(shared_data, out, *extra):
    return main(["bench", "offline", "--task", "uci", "--protocol", "nsac", "--datasets", "yacht", "--controllers",
                 "gmle", "mcd", "--seeds", "2", "--epochs", "1", "--data", str(shared_data), "--out", str(out),
                 "--no-progress", "--set", *SETS[1:], *extra])  # fmt: skip


def test_tiny_grid_tables_plots_and_resume(shared_data, tmp_path):
    out = tmp_path / "bench"
    assert _bench(shared_data, out) == 0
    results = json.loads((out / "results.json").read_text())
    assert [c["status"] for c in results["cells"]] == ["trained"] * 4
    keys = [t["key"] for t in results["tables"]]
    assert keys == ["yacht", "yacht/original", "yacht/authors (y / max y)"]
    head = results["tables"][0]
    assert [r["row"] for r in head["rows"]] == ["gmle", "mcd"] and all(r["seeds"] == [0, 1] for r in head["rows"])
    per_run = [json.loads((out / "runs/yacht/gmle" / f"seed{s}" / "metrics.json").read_text())["test"]["mse"]
               for s in (0, 1)]  # fmt: skip
    assert head["rows"][0]["metrics"]["mse"]["mean"] == pytest.approx(np.mean(per_run))
    assert head["rows"][0]["metrics"]["mse"]["std"] == pytest.approx(np.std(per_run, ddof=1))
    assert head["references"][0]["row"] == "train_mean"
    text = (out / "results.md").read_text()
    assert "### yacht (units: scaled)" in text and "reference: train mean" in text and "ECE: for quantile" in text
    assert "drive train --task uci --controller gmle --seed 0" in text and "torch_threads: 1" in text
    assert all((out / "plots" / f"yacht_{k}.png").is_file() for k in ("reliability", "pit"))

    # a killed run: one cell lost entirely, another interrupted after its epoch (resume.pt, no metrics.json)
    kept = out / "runs/yacht/gmle/seed0/metrics.json"
    stamp = kept.stat().st_mtime_ns
    shutil.rmtree(out / "runs/yacht/mcd/seed1")
    (out / "runs/yacht/gmle/seed1/metrics.json").unlink()
    # and one interrupted under other agents/ code: resuming it would mix controller versions, so set aside
    config = out / "runs/yacht/gmle/seed1/config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "agents_sha": "older"}))
    # and one that cannot resume (here a corrupt resume.pt; in practice: controller code changed since): set aside
    (out / "runs/yacht/mcd/seed0/metrics.json").unlink()
    (out / "runs/yacht/mcd/seed0/resume.pt").write_bytes(b"not a checkpoint")
    assert _bench(shared_data, out) == 0
    results = json.loads((out / "results.json").read_text())
    status = {(c["row"], c["seed"]): c["status"] for c in results["cells"]}
    assert status == {("gmle", 0): "done", ("mcd", 0): "trained", ("gmle", 1): "trained", ("mcd", 1): "trained"}
    assert len(list((out / "runs/yacht/mcd").glob("seed0.stale-*"))) == 1
    assert len(list((out / "runs/yacht/gmle").glob("seed1.stale-*"))) == 1
    assert json.loads(config.read_text())["agents_sha"] == offline.AGENTS_SHA
    assert json.loads((out / "runs/yacht/mcd/seed0/config.json").read_text())["agents_sha"] == offline.AGENTS_SHA
    assert kept.stat().st_mtime_ns == stamp
    assert len(results["tables"][0]["rows"][1]["seeds"]) == 2

    # --refresh: a finished cell of that row which ran other agents/ code is set aside and trained again
    config = out / "runs/yacht/gmle/seed0/config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "agents_sha": "older"}))
    assert _bench(shared_data, out, "--refresh", "gmle") == 0
    status = {(c["row"], c["seed"]): c["status"] for c in json.loads((out / "results.json").read_text())["cells"]}
    assert status == {("gmle", 0): "trained", ("mcd", 0): "done", ("gmle", 1): "done", ("mcd", 1): "done"}
    assert len(list((out / "runs/yacht/gmle").glob("seed0.stale-*"))) == 1

    # another command on the same directory is refused, not mixed in
    with pytest.raises(UserError, match="holds a run of another command"):
        offline.cell_state(offline.cells(offline.make_grid("uci", protocol="nsac", datasets=("yacht",),
                           controllers=("gmle",), seeds=1, out=out, data=str(shared_data), epochs=2,
                           overrides=SETS[1:]))[0])  # fmt: skip
    assert _bench(shared_data, out, "--report-only") == 0


def test_a_row_of_mixed_agents_versions_names_the_files_that_differ():
    from drive.studies.offline.results import _versions_note

    now = {"agents_sha": offline.AGENTS_SHA, "agents_files": offline.AGENTS_FILES}
    assert "agents/ft_transformer.py" in offline.AGENTS_FILES and _versions_note("ft", [now, dict(now)]) is None
    older = {"agents_sha": "older", "agents_files": {**offline.AGENTS_FILES, "agents/base.py": "0" * 12}}
    note = _versions_note("ft", [now, older, {"agents_sha": "oldest"}])
    assert note == ("ft: runs of 3 versions of agents/ (differing in agents/base.py; 1 run(s) from before per-file "
                    "records; `--refresh ft` retrains the older ones)")  # fmt: skip
    gone = {"agents_sha": "new", "agents_files": {**offline.AGENTS_FILES, "agents/extra.py": "1" * 12}}
    assert "differing in agents/extra.py;" in str(_versions_note("ft", [now, gone]))


def test_grid_options_are_checked_and_variants_resolved(tmp_path):
    grid = offline.make_grid("spiral", out=tmp_path, seeds=2)
    cells = offline.cells(grid)
    assert [(c.row, c.controller, c.seed) for c in cells] == [
        ("nsac", "nsac", 0),
        ("nsac", "nsac", 1),
        ("nsac-noreg", "nsac", 0),
        ("nsac-noreg", "nsac", 1),
    ]
    assert "reg_weight=0" in cells[2].overrides and "--set reg_weight=0" in cells[2].command
    assert offline.make_grid("uci", out=tmp_path).seeds == (0, 1, 2)  # the gal default
    for kwargs, match in (
        (dict(protocol="nope"), "has protocols"),
        (dict(datasets=("housing",)), "has boston"),
        (dict(controllers=("nope",)), "not a controller"),
        (dict(seeds=0), "at least one"),
    ):
        with pytest.raises(UserError, match=match):
            offline.make_grid("uci", out=tmp_path, **kwargs)


def test_report_plots_trajectories_and_decomposition(tmp_path):
    """The pooled plots read RUN/trajectory.npz and RUN/predictions.npz as the tasks write them."""
    rng = np.random.default_rng(0)
    run = tmp_path / "run"
    run.mkdir()
    np.savez(run / "trajectory.npz", back=rng.normal(size=(2, 8)), truth=rng.normal(size=(2, 4)),
             mean=rng.normal(size=(2, 4)), std=np.full((2, 4), 0.3), window=np.array([0, 9]))  # fmt: skip
    y = rng.normal(size=(40, 2))
    np.savez(run / "predictions.npz", mean=y + 0.1, aleatoric_var=np.full((40, 2), 0.02),
             epistemic_var=np.full((40, 2), 0.001), y=y)  # fmt: skip
    table = {"key": "toy", "test": "test", "rows": [{"row": "nsac", "run_dirs": [str(run)]}]}
    results = {"tables": [table], "report_plots": ["trajectory", "decomposition", "reliability", "pit"]}
    paths = report_plots.draw(results, tmp_path / "plots")
    assert sorted(p.name for p in paths) == ["toy_decomposition.png", "toy_pit.png", "toy_reliability.png",
                                             "toy_trajectory.png"]  # fmt: skip


def test_cell_lock_skips_a_live_holder_and_takes_a_stale_one(tmp_path):
    run = tmp_path / "cell"
    held = offline.lock(run)
    assert held is not None and held.read_text() == str(os.getpid())
    assert offline.lock(run) is None  # held by a live process (this one)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    held.write_text(dead.stdout.strip())  # its process has exited: the lock is stale
    assert offline.lock(run) == held and held.read_text() == str(os.getpid())
