"""Checkpoints: tensors and primitives only, rebuilt from the file alone, loaded with weights_only=True.

Layout of the dict saved by torch.save:
    format          "drive-checkpoint"
    version         FORMAT_VERSION
    kind            "controller" | "expert" | "monitor"
    name            registry name ("nsac", "gmle", ... for controllers; "ppo" for the expert)
    config          the config dataclass as a dict of primitives
    state_dict      the module's tensors (standardisation buffers included)
    normalisation   input/target statistics as plain lists (also held as buffers; kept here to be readable)
    data            fingerprint of the training data (e.g. sha256 of the dataset manifest) and its path
    metrics         measured scores (validation, evaluation) as floats
    extra           anything else primitive (training command, steps, seeds)

Every file written here is sealed: the sha256 of its bytes sits in its zip comment (see seal) and read() refuses a file
whose bytes no longer match it. Files written before seals are checked by the zip CRCs alone.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from agents.registry import config_from_dict, loadable
from datasets.files import atomic_write
from drive.errors import UserError

if TYPE_CHECKING:
    from agents.base import Controller

FORMAT = "drive-checkpoint"
FORMAT_VERSION = 1


class CheckpointError(UserError):
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


def resave(payload: dict[str, Any], module: nn.Module, path: str | os.PathLike, extra: dict[str, Any]) -> Path:
    """Write a read() payload again with `module`'s current tensors and `extra` merged into its extra (atomically):
    how post-hoc calibrations (fallback threshold, aleatoric temperature) are stored in a checkpoint."""
    return save(
        path,
        kind=payload["kind"],
        name=payload["name"],
        config=payload["config"],
        module=module,
        normalisation=payload["normalisation"],
        data=payload["data"],
        metrics=payload["metrics"],
        extra={**payload["extra"], **extra},
    )


def atomic_torch_save(obj: Any, path: Path) -> None:
    """torch.save to memory, seal (below), write to a temp file beside `path`, then rename: readers never see a
    half-written file, and the archive's layout does not depend on the file's name."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write(path, seal(buffer.getvalue()))


# The seal: the sha256 of the whole archive, held in the zip comment of its end-of-central-directory record (torch and
# every zip reader skip the comment). The zip CRCs cover members' bytes only: a flip in a header, a name or the padding
# torch aligns tensors with loads as if nothing happened; the seal refuses any changed byte.
_EOCD = b"PK\x05\x06"  # end of central directory: 22 bytes, the comment's length in the last two
_SEAL = b"drive-sha256:"
_SEAL_LEN = len(_SEAL) + 64


def seal(archive: bytes) -> bytes:
    """`archive` (a torch zip with no comment) with its sha256 written into its zip comment."""
    if archive[-22:-18] != _EOCD or archive[-2:] != b"\x00\x00":
        raise ValueError("not a torch zip archive ending in a comment-less end-of-central-directory record")
    digest = hashlib.sha256(archive).hexdigest().encode()
    return archive[:-2] + _SEAL_LEN.to_bytes(2, "little") + _SEAL + digest


def check_seal(path: Path) -> bool:
    """True where the file carries a seal that matches its bytes, False where it carries none (written before seals);
    CheckpointError where a seal is there and the bytes no longer match it, or the record around it is damaged."""
    data = path.read_bytes()
    end = data.rfind(_EOCD, max(0, len(data) - 22 - 0xFFFF))
    if end < 0 or data[end + 20 : end + 22] == b"\x00\x00" and end + 22 == len(data):
        return False  # no seal: the zip checks alone decide
    comment_len = int.from_bytes(data[end + 20 : end + 22], "little")
    comment = data[end + 22 :]
    if comment_len != _SEAL_LEN or len(comment) != _SEAL_LEN or not comment.startswith(_SEAL):
        raise CheckpointError(f"{path}: not a readable drive checkpoint: corrupt or truncated (its seal is damaged)")
    if hashlib.sha256(data[: end + 20] + b"\x00\x00").hexdigest().encode() != comment[len(_SEAL) :]:
        raise CheckpointError(
            f"{path}: not a readable drive checkpoint: corrupt (its bytes changed since it was saved: sha256 differs "
            "from its seal)"
        )
    return True


KIND_NAMES = {
    "controller": "a trained controller (drive train)",
    "expert": "an expert (drive expert train)",
    "monitor": "a misbehaviour monitor (drive monitor train)",
}


def _why_unreadable(exc: Exception) -> str:
    """What is wrong with a file torch.load refused, in the user's terms (never torch's advice to unpickle it)."""
    if isinstance(exc, pickle.UnpicklingError) or "weights_only" in str(exc) or "Unsupported global" in str(exc):
        return (
            "it holds pickled Python objects, not only tensors and primitives "
            "(refused unread: loading it could run code)"
        )
    if isinstance(exc, (zipfile.BadZipFile, EOFError)) or "zip archive" in str(exc) or "central directory" in str(exc):
        return "corrupt or truncated (not a complete torch zip archive)"
    return f"not a torch checkpoint ({type(exc).__name__})"


def verify(path: Path) -> None:
    """CheckpointError unless the file's bytes are as written: its seal where it has one, otherwise every member's CRC
    and its name in both zip directories (torch.load checks neither)."""
    if check_seal(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError) as exc:
        raise CheckpointError(f"{path}: not a readable drive checkpoint: {_why_unreadable(exc)}") from None
    if bad is not None:
        raise CheckpointError(f"{path}: not a readable drive checkpoint: corrupt ({bad!r} fails its CRC check)")


def read(path: str | os.PathLike, kind: str | None = None) -> dict[str, Any]:
    """Load and validate the raw payload. Errors name the file and what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    verify(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt zip, truncated file, pickled objects refused by weights_only
        raise CheckpointError(f"{path}: not a readable drive checkpoint: {_why_unreadable(exc)}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a drive checkpoint (no '{FORMAT}' header)")
    if payload.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {payload.get('version')}, expected {FORMAT_VERSION}")
    if kind is not None and payload.get("kind") != kind:
        got = KIND_NAMES.get(str(payload.get("kind")), repr(payload.get("kind")))
        raise CheckpointError(f"{path}: this checkpoint is {got}, but {KIND_NAMES.get(kind, kind)} is needed here")
    return payload


def load_controller(path: str | os.PathLike) -> tuple[Controller, dict[str, Any]]:
    """Rebuild a trained controller (or a wrapper of one: agents/registry.py WRAPPERS, e.g. SA at a calibrated nu)
    from the file alone; returns (controller in eval mode, payload)."""
    payload = read(path, kind="controller")
    name = payload["name"]
    if name not in loadable():
        raise CheckpointError(f"{path}: unknown controller {name!r}; registered: {sorted(loadable())}")
    try:
        cfg = config_from_dict(name, payload["config"])
        model = cfg.build()
        model.load_state_dict(payload["state_dict"])
    except (TypeError, ValueError, RuntimeError) as exc:
        detail = " ".join(str(exc).split())[:300]
        raise CheckpointError(f"{path}: config/weights do not match controller {name!r}: {detail}") from None
    model.eval()
    return model, payload


def load_monitor(path: str | os.PathLike) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild a black-box misbehaviour monitor (agents/monitors; SelfOracle) from the file; (monitor, payload)."""
    from agents.monitors.selforacle import SelfOracle, SelfOracleConfig

    payload = read(path, kind="monitor")
    if payload["name"] != "selforacle":
        raise CheckpointError(f"{path}: unknown monitor {payload['name']!r}; known: selforacle")
    try:
        model = SelfOracle(SelfOracleConfig(**payload["config"]))
        model.load_state_dict(payload["state_dict"])
    except (TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: config/weights do not match monitor 'selforacle': {str(exc)[:300]}") from None
    return model.eval(), payload
