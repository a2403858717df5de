"""The traps a newcomer met after the first command, each closed at its cause: the shrunk pipeline whose episodes are
all flagged, hints that name options no command has, two spellings for a checkpoint or a sample count, the
selection rule told three ways, and a "next:" line that names a `drive` the shell cannot find."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import os
import re
from pathlib import Path

import pytest

from datasets.demonstrations import read_manifest
from drive import cli
from drive.cli import main
from drive.options import drive_program
from tests.conftest import REPO

# words after `--` in the library's text that are another program's options, not ours
OTHER_PROGRAMS = {
    "--head": "ray start --head",
    "--local-dir": "huggingface-cli download",
    "--nnodes": "torchrun",
    "--node": "torchrun --node_rank (split at the underscore)",
    "--nproc": "torchrun --nproc_per_node (split at the underscore)",
    "--rdzv": "torchrun --rdzv_endpoint (split at the underscore)",
    "--standalone": "torchrun",
    "--method": "an arrow in a diagram (`--method head-->`)",
}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")


def _configs():
    for words in cli.COMMANDS:
        yield words, importlib.import_module(cli.module_name(words)).Config


def _options() -> set[str]:
    found = {"--help", "--debug", "--version"}
    for _, config in _configs():
        for f in dataclasses.fields(config):
            flag = f.name.replace("_", "-")
            found |= {f"--{flag}", f"--no-{flag}"}
    return found


def test_every_option_the_library_names_is_one_a_command_has():
    """Hints, errors and help name only real options (`--data-root` was named and did not exist)."""
    options = _options()
    unknown: dict[str, list[str]] = {}
    for package in ("drive", "datasets", "agents", "sim_bridges"):
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for flag in FLAG.findall(node.value):
                        if flag not in options and flag not in OTHER_PROGRAMS:
                            unknown.setdefault(flag, []).append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not unknown, unknown


def test_missing_data_names_the_option_that_points_elsewhere(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DRIVE_DATA_ROOT", str(tmp_path / "nowhere"))
    assert main(["train", "--task", "uci", "--controller", "gmle", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "uci_gal: data folder not found" in err and "as --data ROOT or set $DRIVE_DATA_ROOT" in err
    assert not (tmp_path / "run").exists()


def test_one_name_for_a_checkpoint_and_for_a_sample_count():
    """A trained controller's checkpoint is `--ckpt PATH` wherever a command takes one (not `--policy ckpt:PATH`,
    not `--controller PATH`), and a sample count is `--samples` (not `--n-samples`)."""
    for words, config in _configs():
        shown = {f.name: f for f in dataclasses.fields(config) if "Suppress" not in str(f.type)}
        assert "n_samples" not in shown and "policy" not in shown, words
        for f in shown.values():
            if f.name != "ckpt" and ("Path" in str(f.type)) and f.default is not dataclasses.MISSING:
                assert not str(f.default).endswith(".pt") or f.name == "expert", (words, f.name)


def test_train_help_says_which_score_each_task_selects_on(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    demos = next(line for line in out.splitlines() if line.startswith("  demos (--task demos;"))
    assert demos.endswith("best.pt and early stopping on val_mse)")
    select = next(line for line in out.splitlines() if "trainer.select=" in line)
    assert "the default unless the task sets its own: val_mse for demos" in select


def _fake_road(out: Path, *extra: str) -> list[str]:
    return ["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-2", "--max-episode-steps", "30",
            "--no-progress", "--out", str(out), *extra]  # fmt: skip


def test_a_shrunk_pipeline_says_every_episode_is_flagged_and_a_rerun_reflags(tmp_path, capsys):
    """Short laps fall under the default --min-return 700: collect says what that means, train names the ways
    out, and collect rerun with --min-return 0 re-flags the recorded episodes without recording them again."""
    data = tmp_path / "my demos"
    assert main(_fake_road(data)) == 0
    out = capsys.readouterr().out
    assert "every episode is flagged" in out and "--min-return LOWER" in out
    assert f"inspect with: drive data info '{data}'" in out  # a path with a space, quoted
    shards = {p.name: p.stat().st_mtime_ns for p in (data / "episodes").iterdir()}

    assert main(["train", "--controller", "gmle", "--data", str(data), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "3 of 3 episode(s) are flagged" in err and "--min-return 700.0" in err
    assert "--min-return LOWER" in err and "--set task.include_flagged=true" in err

    assert main(_fake_road(data, "--min-return", "0")) == 0
    out = capsys.readouterr().out
    assert "recorded 0 new episode(s)" in out and "0 flagged" in out
    manifest = read_manifest(data)
    assert manifest["settings"]["min_return"] == 0 and not any(e["flagged"] for e in manifest["episodes"])
    assert {p.name: p.stat().st_mtime_ns for p in (data / "episodes").iterdir()} == shards  # nothing recorded again
    assert main(_fake_road(data, "--action-noise", "0.1", "--min-return", "0")) == 2  # a recording setting: refused
    assert "recorded with other settings (action_noise" in capsys.readouterr().err


def test_the_next_line_names_drive_as_this_shell_can_run_it(tmp_path, monkeypatch):
    script = tmp_path / ".venv" / "bin" / "drive"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # a new shell: the venv not activated
    assert drive_program(str(script)) == ".venv/bin/drive"
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}/usr/bin")  # activated
    assert drive_program(str(script)) == "drive"
    monkeypatch.chdir(REPO)  # started from elsewhere: the full path, quoted where it needs it
    spaced = tmp_path / "my env" / "drive"
    spaced.parent.mkdir()
    spaced.write_text("#!/bin/sh\n")
    monkeypatch.setenv("PATH", "/usr/bin")
    assert drive_program(str(spaced)) == f"'{spaced}'"
    assert drive_program(str(REPO / "drive" / "__main__.py")) == "python -m drive"


def test_metrics_json_records_the_score_it_selected_on(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--controller", "gmle", "--task", "spiral", "--no-progress", "--epochs", "1", "--out",
                 str(run), "--set", "task.n_obs=5", "task.n_freqs=2", "encoder.d_model=8", "n_heads=2",
                 "trainer.tensorboard=false", "trainer.select=val_mse"]) == 0  # fmt: skip
    fit = json.loads((run / "metrics.json").read_text())["fit"]
    assert fit["select"] == "val_mse" and fit["best_val_score"] > 0
    assert f"(selected on val mse {fit['best_val_score']:.5g})" in capsys.readouterr().out
