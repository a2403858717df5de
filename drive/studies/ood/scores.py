"""Offline OOD detection: does a controller's uncertainty rise on perturbed camera frames? (`drive ood`)

In-distribution inputs are frame stacks of the checkpoint's held-out test episodes, named by its data fingerprint
(the episodes `drive.learn.tasks.rebuild` would make its test split of; only those are read, not the training
split). Out-of-distribution inputs are the same steps seen through a perturbed camera (drive/perturb/camera.py): the
raw frames are perturbed, then coded and stacked by the checkpoint's own `ObservationCoder`, exactly as in closed
loop. Each controller scores every stack with its predictive variances; the AUROC of a score separating perturbed
(positive) from clean stacks is reported for the epistemic, the total and the aleatoric variance. Two scores per
kind: `steer` (the fallback gate's signal) and `all`, the sum over the three actions of the variance in
standardised target units (each action divided by its training-target variance, so no action dominates).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from datasets.demonstrations import Demonstrations, Episode
from datasets.frames import ObservationCoder
from datasets.regenerate import require_episodes
from drive import metrics
from drive.errors import UserError

if TYPE_CHECKING:
    from agents.base import Controller

KINDS = ("epistemic", "total", "aleatoric")


def test_episodes(fingerprint: Mapping[str, Any], max_episodes: int = 0) -> Iterator[Episode]:
    """The checkpoint's test episodes (first `max_episodes` of them; 0: all), from its demos fingerprint."""
    if fingerprint.get("task") not in (None, "demos") or "test_seeds" not in fingerprint:
        raise UserError(f"drive ood needs a controller trained on demonstrations (task {fingerprint.get('task')!r})")
    root = Path(fingerprint.get("test_data") or fingerprint["path"])
    seeds = [int(s) for s in fingerprint["test_seeds"]]
    require_episodes(root, seeds[:max_episodes] if max_episodes > 0 else seeds, dict(fingerprint))
    data = Demonstrations(root, include_flagged=True)
    for seed in seeds[:max_episodes] if max_episodes > 0 else seeds:
        yield data.load(seed)


def code_stacks(raw: np.ndarray, coder: ObservationCoder, steps: np.ndarray) -> torch.Tensor:
    """Raw frames (T, 96, 96, 3) of one episode -> the controller inputs at `steps`, (len(steps), k, 84, 84) uint8,
    coded and stacked frame by frame as the closed loop does (reset padding included)."""
    coder.reset()
    wanted, out = set(int(s) for s in steps), []
    for t, frame in enumerate(raw[: int(steps.max()) + 1]):
        x = coder(frame)
        if t in wanted:
            out.append(x[0])
    return torch.stack(out)


@torch.inference_mode()
def uncertainty_scores(
    model: Controller, x: torch.Tensor, samples: int | None = None, seed: int = 0, batch_size: int = 256
) -> dict[str, np.ndarray]:
    """{f'{kind}_{steer|all}': (N,)} for inputs x (N, ...): the predictive variances as OOD scores."""
    generator = torch.Generator().manual_seed(seed)
    parts = [model.predict(x[s : s + batch_size], samples, generator) for s in range(0, len(x), batch_size)]
    ale = torch.cat([p.aleatoric_var for p in parts]).double()  # (N, D)
    epi = torch.cat([p.epistemic_var for p in parts]).double()
    scale2 = model.y_scale.double() ** 2  # (D,) the training targets' variance
    out = {}
    for kind, var in (("epistemic", epi), ("aleatoric", ale), ("total", ale + epi)):
        out[f"{kind}_steer"] = var[:, 0].numpy()
        out[f"{kind}_all"] = (var / scale2).sum(1).numpy()
    return out


def auroc_report(clean: Mapping[str, np.ndarray], perturbed: Mapping[str, np.ndarray]) -> dict[str, float]:
    """AUROC of every score separating perturbed (positive) from clean inputs, and the scores' medians."""
    out: dict[str, float] = {}
    for key in clean:
        out[f"auroc_{key}"] = metrics.auroc(clean[key], perturbed[key])
        out[f"median_clean_{key}"] = float(np.median(clean[key]))
        out[f"median_perturbed_{key}"] = float(np.median(perturbed[key]))
    return out
