"""Device plumbing on the CPU: names resolve or are refused in one line; the closed loop runs through the one place
that moves tensors (drive/devices.py). No GPU here: what a CUDA machine adds is the same calls on another device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from drive.cli import main
from drive.devices import resolve, to_device, to_host
from drive.errors import UserError

NSAC = Path(__file__).resolve().parents[2] / "checkpoints" / "carracing_nsac.pt"
NO_CUDA = not torch.cuda.is_available()


def test_device_names_resolve_or_are_refused():
    assert resolve("cpu") == torch.device("cpu")
    with pytest.raises(UserError, match="not a device name"):
        resolve("gpu0")
    with pytest.raises(UserError, match="unsupported device type"):
        resolve("meta")
    if NO_CUDA:
        with pytest.raises(UserError, match="CUDA is not available"):
            resolve("cuda")
    else:
        with pytest.raises(UserError, match="CUDA device"):
            resolve(f"cuda:{torch.cuda.device_count()}")


def test_tensors_move_through_one_place():
    x = torch.arange(6.0)
    assert to_device(x, torch.device("cpu")) is x and to_host(x) is x
    assert to_device(x, torch.device("meta")).device.type == "meta"  # another device: moved, not shared


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA: the refusal is what a CPU machine shows")
@pytest.mark.parametrize("command", [
    ["train", "--controller", "gmle", "--task", "spiral", "--epochs", "1", "--device", "cuda"],
    ["eval", "--ckpt", str(NSAC), "--seeds", "1000", "--device", "cuda"],
])  # fmt: skip
def test_a_missing_cuda_is_one_line_and_nothing_written(command, tmp_path, capsys):
    out = tmp_path / "out"
    args = [*command, "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUDA is not available" in err[0] and err[0].startswith(f"drive {command[0]}: error:")
    assert not out.exists()


@pytest.mark.skipif(not NSAC.exists(), reason="the shipped checkpoint is absent")
def test_a_controller_on_an_explicit_device_acts_as_on_the_default():
    from drive.loop.specs import ckpt_policy

    frame = np.random.default_rng(0).integers(0, 256, (96, 96, 3), dtype=np.uint8)
    outs = []
    for device in (None, "cpu"):
        policy = ckpt_policy(str(NSAC), shadow="none", **({"device": device} if device else {}))
        policy.reset(seed=1)
        outs.append(policy.act(frame, {}).action)
        assert next(policy.model.parameters()).device.type == "cpu"
    assert np.array_equal(*outs)
