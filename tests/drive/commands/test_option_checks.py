"""Values that used to pass unchecked (issue #25): `--set` fields, seed lists, worker counts, `--data` for a task that
takes none, an empty runs folder, unwritable outputs, a trace folder. Each ends in one line, exit 2, before anything
is computed or written."""

from __future__ import annotations

import ast
import dataclasses
import math
import typing

import pytest

from agents.registry import CONTROLLERS
from drive.cli import main
from drive.options import MAX_WORKERS
from tests.conftest import REPO


def _one_line_error(capsys, command: str) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip() and not line.startswith("WARNING")]
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"drive {command}: error: "), lines[0]
    assert "Traceback" not in captured.err
    return lines[0]


def _size_fields(name: str) -> list[str]:
    """encoder.d_model and every count field (n_*) of a registered controller config."""
    hints = typing.get_type_hints(CONTROLLERS[name])
    counts = [f.name for f in dataclasses.fields(CONTROLLERS[name]) if f.name.startswith("n_") and hints[f.name] is int]
    return ["encoder.d_model", *counts]


SIZE_CASES = [(name, key, value) for name in CONTROLLERS for key in _size_fields(name) for value in ("0", "-4")]


@pytest.mark.parametrize("controller, key, value", SIZE_CASES)
def test_a_zero_or_negative_size_given_with_set_is_refused_before_training(tmp_path, capsys, controller, key, value):
    out = tmp_path / "run"
    argv = ["train", "--controller", controller, "--out", str(out), "--no-progress", "--set", f"{key}={value}"]
    assert main(argv) == 2
    line = _one_line_error(capsys, "train")
    assert f"{key.split('.')[-1]}={value}" in line, line
    assert not out.exists()


@pytest.mark.parametrize("controller", list(CONTROLLERS))
def test_every_controller_config_refuses_bad_probabilities_and_non_finite_numbers(controller):
    cls = CONTROLLERS[controller]
    hints = typing.get_type_hints(cls)
    default = cls()
    for f in dataclasses.fields(cls):
        if hints[f.name] is float:
            with pytest.raises(ValueError, match=f.name):
                dataclasses.replace(default, **{f.name: math.nan})
        if "dropout" in f.name:
            with pytest.raises(ValueError, match=f"{f.name}=1.0 must be in \\[0, 1\\)"):
                dataclasses.replace(default, **{f.name: 1.0})


def test_the_shipped_checkpoints_configs_still_pass():
    from drive import checkpoint

    for name in ("carracing_nsac.pt", "udacity_nsac.pt"):
        model, _ = checkpoint.load_controller(REPO / "checkpoints" / name)
        assert model.cfg.encoder.d_model >= 1


@pytest.mark.parametrize(
    "item, needle",
    [
        ("trainer.patience=-1", "trainer.patience=-1 must be >= 0"),
        ("trainer.lr=0", "trainer.lr=0.0 must be > 0"),
        ("trainer.schedule=linear", "trainer.schedule='linear' must be one of cosine, constant"),
        (f"trainer.num_workers={MAX_WORKERS + 1}", "trainer.num_workers"),
        ("task.eval_samples=-1", "task 'spiral': task.eval_samples=-1 must be >= 0"),
        ("task.noise_std=nan", "task.noise_std=nan must be >= 0"),
        ("encoder.d_model=30", "n_heads=4 must divide encoder.d_model=30"),
    ],
)
def test_trainer_task_and_cross_field_values_are_checked_too(tmp_path, capsys, item, needle):
    out = tmp_path / "run"
    assert main(["train", "--controller", "nsac", "--out", str(out), "--no-progress", "--set", item]) == 2
    assert needle in _one_line_error(capsys, "train")
    assert not out.exists()


@pytest.mark.parametrize("seeds", ["1,2,,3", "1,", ",1", "5-1", "-1", "1--3", "x", "1.5", " "])
def test_a_malformed_seed_list_is_refused(capsys, monkeypatch, seeds):
    monkeypatch.setattr("drive.loop.evaluate.evaluate", pytest.fail)
    assert main(["eval", "--env", "fake-road", "--expert", "pursuit", "--seeds", seeds]) == 2
    assert "seed spec" in _one_line_error(capsys, "eval")


def test_a_malformed_calibration_seed_list_is_refused_before_the_evaluation(capsys, monkeypatch):
    monkeypatch.setattr("drive.loop.evaluate.evaluate", pytest.fail)
    assert main(["eval", "--env", "fake-road", "--expert", "pursuit", "--calibrate-seeds", "2000,,2001"]) == 2
    assert "empty item" in _one_line_error(capsys, "eval")


@pytest.mark.parametrize(
    "argv, command",
    [
        (["eval"], "eval"),
        (["collect", "--out", "unused"], "collect"),
        (["dagger", "--ckpt", "c", "--data", "d", "--seeds", "5", "--out", "unused"], "dagger"),
        (["demo"], "demo"),
        (["bench", "robustness", "--ckpt", "c", "--out", "unused"], "bench robustness"),
        (["bench", "dagger", "--ckpt", "c", "--data", "d", "--out", "unused"], "bench dagger"),
    ],
)
def test_an_absurd_worker_count_is_refused_by_every_command(capsys, argv, command):
    assert main([*argv, "--workers", "100000"]) == 2
    assert f"--workers: 100000 is too many: at most {MAX_WORKERS}" in _one_line_error(capsys, command)


def test_every_workers_option_uses_the_shared_type():
    """Any dataclass field named `workers` under drive/ is annotated `Workers` (drive/options.py)."""
    offenders = []
    for path in sorted((REPO / "drive").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "workers":
                if ast.unparse(node.annotation) != "Workers":
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders


def test_a_task_without_data_refuses_data(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--task", "spiral", "--controller", "gmle", "--data", str(tmp_path), "--out", str(out)]
    assert main(argv) == 2
    assert "task 'spiral' takes no --data" in _one_line_error(capsys, "train")
    assert not out.exists()


def test_results_on_a_folder_without_runs_is_an_error(tmp_path, capsys):
    (tmp_path / "nsac").mkdir()  # a folder, but no run in it
    assert main(["results", "--runs", str(tmp_path)]) == 2
    line = _one_line_error(capsys, "results")
    assert str(tmp_path) in line and "no runs" in line and "metrics.json" in line
    assert main(["results", "--runs", str(tmp_path / "missing")]) == 2
    assert "no such folder" in _one_line_error(capsys, "results")


@pytest.mark.parametrize("option", ["--out", "--trace"])
def test_an_unwritable_output_fails_before_the_evaluation(tmp_path, capsys, monkeypatch, option):
    monkeypatch.setattr("drive.loop.evaluate.evaluate", pytest.fail)
    blocker = tmp_path / "file.txt"  # a regular file where a folder is needed (chmod stops nobody when root)
    blocker.write_text("")
    target = blocker / "sub" / ("out.json" if option == "--out" else "trace")
    argv = ["eval", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0", option, str(target)]
    assert main(argv) == 2
    line = _one_line_error(capsys, "eval")
    assert f"{option} {target}: cannot write there ({blocker} is a file, not a folder)" in line


def test_eval_out_naming_a_folder_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("drive.loop.evaluate.evaluate", pytest.fail)
    assert main(["eval", "--env", "fake-road", "--expert", "pursuit", "--out", str(tmp_path)]) == 2
    assert "is a folder; give a file path" in _one_line_error(capsys, "eval")


def test_replay_of_a_trace_folder_points_to_its_files(tmp_path, capsys):
    assert main(["replay", str(tmp_path), "--out", str(tmp_path / "v.mp4")]) == 2
    assert "is a folder without trace files" in _one_line_error(capsys, "replay")
    for seed in (7, 3):
        (tmp_path / f"trace_seed{seed:06d}.parquet").write_bytes(b"")
    assert main(["replay", str(tmp_path), "--out", str(tmp_path / "v.mp4")]) == 2
    line = _one_line_error(capsys, "replay")
    assert f"is a folder; give one of its 2 trace files, e.g. {tmp_path / 'trace_seed000003.parquet'}" in line
