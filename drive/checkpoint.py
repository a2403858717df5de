"""Checkpoints: tensors and primitives only, rebuilt from the file alone, loaded with weights_only=True.

Layout of the dict saved by torch.save:
    format          "drive-checkpoint"
    version         FORMAT_VERSION
    kind            "controller" | "expert"
    name            registry name ("nsac", "gmle", ... for controllers; "ppo" for the expert)
    config          the config dataclass as a dict of primitives
    state_dict      the module's tensors (standardisation buffers included)
    normalisation   input/target statistics as plain lists (also held as buffers; kept here to be readable)
    data            fingerprint of the training data (e.g. sha256 of the dataset manifest) and its path
    metrics         measured scores (validation, evaluation) as floats
    extra           anything else primitive (training command, steps, seeds)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

FORMAT = "drive-checkpoint"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, corrupt, of the wrong kind or of an unknown version."""


def save(
    path: str | os.PathLike,
    *,
    kind: str,
    name: str,
    config: dict[str, Any],
    module: nn.Module,
    normalisation: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write atomically (temp file + rename): a kill mid-save never leaves a half-written checkpoint."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "kind": kind,
        "name": name,
        "config": config,
        "state_dict": {k: v.detach().cpu() for k, v in module.state_dict().items()},
        "normalisation": normalisation or {},
        "data": data or {},
        "metrics": metrics or {},
        "extra": extra or {},
    }
    atomic_torch_save(payload, path)
    return path


def atomic_torch_save(obj: Any, path: Path) -> None:
    """torch.save to a temp file beside `path`, then rename: readers never see a half-written file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read(path: str | os.PathLike, kind: str | None = None) -> dict[str, Any]:
    """Load and validate the raw payload. Errors name the file and what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt zip, truncated file, pickled objects refused by weights_only
        raise CheckpointError(f"{path}: not a readable drive checkpoint ({type(exc).__name__}: {exc})") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a drive checkpoint (no '{FORMAT}' header)")
    if payload.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {payload.get('version')}, expected {FORMAT_VERSION}")
    if kind is not None and payload.get("kind") != kind:
        raise CheckpointError(f"{path}: a checkpoint of kind {payload.get('kind')!r}, expected {kind!r}")
    return payload


def load_controller(path: str | os.PathLike):
    """Rebuild a trained controller from the file alone; returns (controller in eval mode, payload)."""
    from agents.registry import CONTROLLERS, config_from_dict

    payload = read(path, kind="controller")
    name = payload["name"]
    if name not in CONTROLLERS:
        raise CheckpointError(f"{path}: unknown controller {name!r}; registered: {sorted(CONTROLLERS)}")
    try:
        cfg = config_from_dict(name, payload["config"])
        model = cfg.build()
        model.load_state_dict(payload["state_dict"])
    except (TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: config/weights do not match controller {name!r}: {exc}") from exc
    model.eval()
    return model, payload
