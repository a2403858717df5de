"""Every registered task honours the plugin contract (drive/learn/tasks/__init__.py), parametrised over TASKS."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from agents.registry import CONTROLLERS
from drive.cli import main
from drive.learn import tasks
from drive.learn.batches import take
from tests.conftest import SHARED_DATA


@pytest.fixture(scope="module")
def demos_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("contract") / "demos"
    assert main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-4", "--max-episode-steps",
                 "30", "--min-return", "-1000", "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    return out


def _data_for(name: str, demos_dir, request):
    mod = tasks.module(name)
    if not mod.DATA:
        return None
    if name == "demos":
        return demos_dir
    request.getfixturevalue("shared_data")  # skips (or fails under CI) without the real data
    return SHARED_DATA / "udacity_sim" if name == "udacity" else SHARED_DATA


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_task_contract(name, demos_dir, request):
    mod = tasks.module(name)
    assert dataclasses.is_dataclass(mod.Options) and mod.Options.__dataclass_params__.frozen
    assert isinstance(mod.DATA, str) and callable(mod.build)
    opts = tasks.options(name, dict(getattr(mod, "SMOKE_OPTIONS", {})))
    data = tasks.load(name, opts, _data_for(name, demos_dir, request), 0)
    assert data.name == name and data.out_dim == len(data.target_names) >= 1
    for split in (data.train, data.val, data.test):
        assert len(split) > 0
        x, y = take(split, torch.arange(min(3, len(split))))
        assert y.shape == (len(x), data.out_dim) and torch.isfinite(y.float()).all()
    json.dumps(data.fingerprint)  # primitives only: it travels inside checkpoints (weights_only=True)
    assert data.fingerprint["task"] == name and "options" in data.fingerprint
    for key in ("DATASETS", "PROTOCOLS", "CONTROLLERS"):  # the offline-benchmark attributes, where defined
        if hasattr(mod, key):
            assert isinstance(getattr(mod, key), tuple) and getattr(mod, key)
    if hasattr(mod, "CONTROLLERS"):
        assert set(mod.CONTROLLERS) <= set(CONTROLLERS)
    some = next(c for c in ("gmle", *CONTROLLERS) if c in CONTROLLERS)
    model = CONTROLLERS[some](encoder=data.encoder, out_dim=data.out_dim).build().eval()
    x, _ = take(data.test, torch.arange(min(2, len(data.test))))
    with torch.no_grad():
        assert model.predict(x).mean.shape == (len(x), data.out_dim)
