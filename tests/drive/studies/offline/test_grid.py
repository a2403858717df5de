"""drive/studies/offline/grid.py: a run directory is the grid's own when its recorded command is the grid's, display
flags aside; any other command there is refused."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from drive.errors import UserError
from drive.studies.offline import grid

COMMAND = "drive train --task demos --controller nsac --seed 0 --out runs/x/seed0 --threads 1 --epochs 20 --set a=1"


def _cell(tmp_path, recorded: str) -> SimpleNamespace:
    (tmp_path / "config.json").write_text(json.dumps({"command": recorded}))
    (tmp_path / "metrics.json").write_text("{}")
    return SimpleNamespace(run_dir=tmp_path, command=COMMAND)


@pytest.mark.parametrize("flag", ["--no-progress", "--progress"])
def test_a_run_trained_with_a_display_flag_is_the_grids_run(tmp_path, flag):
    assert grid.cell_state(_cell(tmp_path, COMMAND.replace(" --set", f" {flag} --set"))) == "done"  # type: ignore[arg-type]


@pytest.mark.parametrize("other", ["--seed 1", "--epochs 19", "--set a=2"])
def test_a_run_of_another_command_is_refused(tmp_path, other):
    key = other.split()[0]
    changed = COMMAND.replace({"--seed": "--seed 0", "--epochs": "--epochs 20", "--set": "--set a=1"}[key], other)
    with pytest.raises(UserError, match="holds a run of another command"):
        grid.cell_state(_cell(tmp_path, changed))  # type: ignore[arg-type]
