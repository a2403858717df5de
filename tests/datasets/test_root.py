"""Outputs name no folder of the machine that made them: `portable` and the shipped checkpoints."""

from __future__ import annotations

import os

import pytest

from datasets.root import portable, portable_command
from drive import checkpoint
from tests.conftest import REPO


def test_absolute_paths_become_relative_to_the_base_in_every_form():
    base = "/work/main"
    got = portable({"path": "/work/main/runs/d2", "data": ["udacity:/work/shared/data/a,/work/shared/data/b"],
                    "set": "task.test_data=/work/main/t", "name": "nsac", "n": 3, "rel": "runs/x",
                    "url": "http://host/x"}, base)  # fmt: skip
    assert got == {"path": "runs/d2", "data": ["udacity:../shared/data/a,../shared/data/b"], "set": "task.test_data=t",
                   "name": "nsac", "n": 3, "rel": "runs/x", "url": "http://host/x"}  # fmt: skip
    command = "drive train --data 'udacity:/work/shared/data/my lake' --out /work/main/runs/a --epochs 8"
    assert (
        portable_command(command, base) == "drive train --data 'udacity:../shared/data/my lake' --out runs/a --epochs 8"
    )


def _strings(value, where=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{where}[{i}]")
    elif isinstance(value, str):
        yield where, value


@pytest.mark.parametrize("path", sorted((REPO / "checkpoints").glob("*.pt")), ids=lambda p: p.name)
def test_a_shipped_checkpoint_stores_no_absolute_path(path):
    payload = checkpoint.read(path)
    found = [(where, s) for where, s in _strings({k: v for k, v in payload.items() if k != "state_dict"})
             if any(os.path.isabs(w.split(":", 1)[-1].split("=", 1)[-1]) for w in s.split())]  # fmt: skip
    assert not found, found
