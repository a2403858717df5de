"""What an exact resume restores besides the weights: the global torch / numpy / python RNG states (the model's own
sampling), the seeding of a fresh run, and the epoch log cut back to the resume point.

    state = get_state()   # primitives and tensors only: resume.pt loads with weights_only=True
    set_state(state)
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch


def get_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "python": random.getstate(),
    }


def set_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def truncate_log(path: Path, epoch: int) -> None:
    """Drop log lines of epochs after the resume point (written before a kill, then redone)."""
    if not path.is_file():
        return
    keep = [line for line in path.read_text().splitlines() if line and json.loads(line)["epoch"] <= epoch]
    path.write_text("".join(line + "\n" for line in keep))
