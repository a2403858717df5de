"""The OOD-detection study behind `drive ood` and `drive bench controllers`: each controller's uncertainty on test
frames against the same frames through a perturbed camera (the scores: drive/studies/ood/scores.py).

Test frames of each checkpoint's data (its fingerprint's test episodes) against the same steps through a perturbed
camera; AUROC of the epistemic, total and aleatoric variance per controller and perturbation, the JSON written
atomically and the score distributions plotted beside it (FILE.png). Raw frames come from the dataset when it kept
them (`drive collect --keep-raw`), else from replaying the episode's actions (checked against its coded frames);
`domain_randomize` always replays, with the world recoloured after the track is built.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from datasets.files import atomic_write
from drive.errors import UserError
from drive.options import NonNegativeInt, PositiveInt

if TYPE_CHECKING:  # torch and the simulator: each function below imports what it runs, not `drive ood --help`
    from agents.base import Controller
    from datasets.frames import ObservationCoder


@dataclass(frozen=True)
class OODOptions:
    ckpt: tuple[Path, ...]
    """controller checkpoints (trained on demonstrations); their fingerprints name the test episodes"""
    out: Path
    """results JSON (the score-distribution figure is written beside it, same name with .png)"""
    perturb: str = "noise:0.1,blur:2,occlusion:0.1,brightness:0.5,domain_randomize"
    """perturbations KIND:LEVEL[,...]: noise (std, [0, 1] pixel units), blur (sigma px), occlusion (fraction of the
    frame), brightness (factor), domain_randomize (no level)"""
    max_episodes: NonNegativeInt = 8
    """test episodes used (0: all)"""
    every: PositiveInt = 10
    """score every N-th step of each test episode"""
    samples: PositiveInt | None = None
    """stochastic samples per prediction (default: each controller's own)"""
    seed: NonNegativeInt = 0
    """seed of the perturbations and of the controllers' sampling"""
    threads: PositiveInt = 1
    """torch CPU threads"""
    data: Path | None = None
    """the checkpoints' demonstrations when they are not where the fingerprint says (a fresh clone): a folder that
    `drive collect` regenerated (the error names the command)"""


def _raw(ep, max_steps: int) -> np.ndarray:
    from datasets.frames import code_frames
    from drive.studies.ood.replay import replay_frames

    if ep.raw is not None:
        return ep.raw[:max_steps]
    raw = replay_frames(ep.action[:max_steps], ep.seed)
    coding_k = ep.frame_stack - 1
    # the replay must revisit the recorded states: its frames code to the recorded ones (any coding recorded)
    for coding in ("full", "cropped"):
        if np.array_equal(code_frames(raw[:50], coding), ep.frames[coding_k : coding_k + 50]):
            return raw
    raise UserError(f"episode seed {ep.seed}: replaying its actions does not reproduce its frames")


def _inputs(cfg: OODOptions, perturbations, coders: dict[tuple, ObservationCoder]):
    """{coder key: {'clean' | str(p): (N, k, 84, 84)}} over the test episodes of the first checkpoint's data."""
    import torch

    from datasets.regenerate import relocate
    from drive import checkpoint
    from drive.perturb.camera import WORLD_KINDS, FramePerturber
    from drive.studies.ood.replay import replay_frames
    from drive.studies.ood.scores import code_stacks, test_episodes

    fingerprint = relocate(checkpoint.read(cfg.ckpt[0], kind="controller").get("data", {}), cfg.data)
    stacks: dict[tuple, dict[str, list[torch.Tensor]]] = {key: {} for key in coders}
    for ep in test_episodes(fingerprint, cfg.max_episodes):
        steps = np.arange(0, len(ep), cfg.every)
        raw = _raw(ep, int(steps.max()) + 1)
        views = {"clean": raw}
        for p in perturbations:
            if p.kind in WORLD_KINDS:
                views[str(p)] = replay_frames(ep.action[: len(raw)], ep.seed, p, perturb_seed=cfg.seed)
            else:
                perturber = FramePerturber(p, cfg.seed)
                perturber.reset(ep.seed)
                views[str(p)] = np.stack([perturber(f) for f in raw])
        for key, coder in coders.items():
            for name, frames in views.items():
                stacks[key].setdefault(name, []).append(code_stacks(frames, coder, steps))
        print(f"episode {ep.seed}: {len(steps)} steps x {len(views)} views")
    return {key: {name: torch.cat(parts) for name, parts in views.items()} for key, views in stacks.items()}


def _unique(name: str, path: Path, taken: dict) -> str:
    """The controller's name, or name:DIR/.../DIR with as many of its folders as make it unique (three NSAC variants
    of one seed differ only two folders up), or a counter as the last resort."""
    parents = path.parent.parts
    for n in range(len(parents) + 1):
        label = f"{name}:{'/'.join(parents[len(parents) - n :])}" if n else name
        if label not in taken:
            return label
    return next(f"{name}#{i}" for i in range(2, len(taken) + 3) if f"{name}#{i}" not in taken)


def detect(cfg: OODOptions) -> int:
    """Score every checkpoint on clean and perturbed test frames; write cfg.out (JSON) and its figure."""
    import torch

    from datasets.frames import ObservationCoder
    from drive import checkpoint
    from drive.observe.uq_plots import plot_ood_scores
    from drive.perturb.camera import parse_perturbations
    from drive.studies.ood.scores import auroc_report, uncertainty_scores

    torch.set_num_threads(cfg.threads)
    if not cfg.ckpt:
        raise UserError("give at least one --ckpt")
    if cfg.every < 1:
        raise UserError(f"--every must be >= 1, got {cfg.every}")
    try:
        perturbations = parse_perturbations(cfg.perturb)
    except ValueError as exc:
        raise UserError(f"--perturb: {exc}") from None
    start = time.perf_counter()
    # name -> (controller, its coder's (coding, input, k), checkpoint path, training data's manifest sha256)
    models: dict[str, tuple[Controller, tuple[str, str, int], str, str | None]] = {}
    for path in cfg.ckpt:
        model, payload = checkpoint.load_controller(path)
        fp = payload.get("data", {})
        coder = ObservationCoder.from_fingerprint(fp, payload["config"].get("encoder", {}).get("n_tokens", 4))
        name = _unique(payload["name"], Path(path), models)
        models[name] = (model, (coder.coding, coder.input, coder.k), str(path), fp.get("manifest_sha256"))
    if len({m[3] for m in models.values()}) > 1:
        raise UserError("--ckpt: the checkpoints were trained on different data (manifest sha256 differ)")
    coders = {m[1]: ObservationCoder(*m[1]) for m in models.values()}
    inputs = _inputs(cfg, perturbations, coders)
    results: dict[str, dict[str, Any]] = {}
    scores: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    for name, (model, key, ckpt, _) in models.items():
        views = {view: uncertainty_scores(model, x, cfg.samples, cfg.seed) for view, x in inputs[key].items()}
        scores[name] = views
        results[name] = {"ckpt": ckpt, **{str(p): auroc_report(views["clean"], views[str(p)]) for p in perturbations}}
        print(name + ": " + ", ".join(f"{p} {results[name][str(p)]['auroc_epistemic_all']:.3f}" for p in perturbations))
    out = {
        "perturbations": [str(p) for p in perturbations],
        "n_clean": int(len(next(iter(inputs.values()))["clean"])),
        "settings": {"max_episodes": cfg.max_episodes, "every": cfg.every, "samples": cfg.samples, "seed": cfg.seed},
        "controllers": results,
        "wall_s": time.perf_counter() - start,
    }
    atomic_write(Path(cfg.out), (json.dumps(out, indent=1) + "\n").encode())
    figure = plot_ood_scores(scores, [str(p) for p in perturbations], Path(cfg.out).with_suffix(".png"))
    print(f"wrote {cfg.out} and {figure}")
    return 0
