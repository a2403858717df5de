"""A checkpoint's demonstrations, found again: read them from a copy, or say in one line how to regenerate them.

A controller trained on demonstrations stores its data's fingerprint (drive/learn/tasks/demos.py): the folder, the
manifest's sha256, the expert and DART noise, the split's track seeds, and the seeds a `drive dagger` round recorded.
In a fresh clone the folder is absent; `drive collect` remakes a collected episode bit for bit from its seed (the
collection is deterministic), but not a DAgger episode, which a trained clone drove.

Never imports `drive`, `agents` or `sim_bridges`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from datasets.demonstrations import DemonstrationError, Demonstrations
from datasets.frames import fingerprint_coding


def relocate(fp: Mapping[str, Any], data: Path | None) -> Mapping[str, Any]:
    """The fingerprint with its demonstrations read from `data` (a copy, or a regeneration by `drive collect`: one
    episode per seed, bit for bit) instead of the folder it names; None leaves it."""
    return fp if data is None else {**fp, "path": str(data), "test_data": None}


def require_episodes(root: Path, seeds: list[int], fp: Mapping[str, Any]) -> None:
    """A one-line error when `root` lacks any of the episodes `seeds`: the `drive collect` command that regenerates
    the collected ones, and the DAgger ones named apart (only the commands that made the dataset remake those)."""
    have = set(Demonstrations(root, include_flagged=True).seeds) if (root / "manifest.json").is_file() else set()
    missing = [s for s in seeds if s not in have]
    if not missing:
        return
    dagger = set(fp.get("dagger_seeds") or ())
    collected = ",".join(str(s) for s in seeds if s not in dagger)
    driven = ",".join(str(s) for s in seeds if s in dagger)
    how = []
    if collected:
        how.append(
            f"collection is deterministic per seed, so `drive collect --expert {fp.get('expert')} "
            f"--action-noise {fp.get('action_noise', 0.0):g} --frame-coding {fingerprint_coding(fp)} "
            f"--seeds {collected} --out DIR` regenerates them"
        )
    if driven:
        how.append(
            f"episodes {driven} were recorded by a `drive dagger` round (a trained clone drove them), which "
            "only the commands that made the dataset regenerate (for the shipped checkpoint: README)"
        )
    more = " ..." if len(missing) > 6 else ""
    raise DemonstrationError(
        f"{root}: the checkpoint's episodes {missing[:6]}{more} are not here; {'; '.join(how)}: then pass --data DIR"
    )
