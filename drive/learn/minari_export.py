"""A recorded demonstration dataset (datasets/demonstrations.py) as a Minari dataset (the `minari` extra).

Per episode of T steps: observations (T + 1, k, 84, 84) uint8, the controller's frame stacks (the stack after the
last step was never recorded: the last one is repeated, so a learner must not read meaning into obs[T]); actions
(T, 3), the executed (DART-noised) action; rewards (T,); terminations / truncations, all False but the last step's,
which is the episode's own; infos, one per observation (T + 1, the last repeated like the observation): `label`,
the expert's clean action at obs t (what `drive train` clones), and the privileged `state`, `progress`, `speed`.
The episode seed is the track seed. Flagged episodes are left out, as `drive train` leaves them out.

Minari 0.5's `EpisodeBuffer.add_step_data` needs jax (its `create` extra, jax + jaxlib: an 89 MB download); the
buffers here are built from whole-episode arrays, so only `minari` itself (12 MB with its dependencies) and the
pyarrow the core already has are needed. The dataset goes to OUT/<dataset_id> (Minari's MINARI_DATASETS_PATH).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from datasets.demonstrations import Demonstrations
from datasets.root import portable
from drive.errors import UserError


def _buffer(episode, index: int):
    from minari.data_collector import EpisodeBuffer

    stacks = np.ascontiguousarray(episode.stacks())  # (T, k, 84, 84)
    observations = np.concatenate([stacks, stacks[-1:]])  # (T + 1, k, 84, 84)
    n = len(episode)
    terminated, truncated = np.zeros(n, bool), np.zeros(n, bool)
    terminated[-1], truncated[-1] = bool(episode.meta.get("terminated")), bool(episode.meta.get("truncated", True))
    steps = {"label": episode.label, "state": episode.state, "progress": episode.progress, "speed": episode.speed}
    # one info per observation, as Minari stores them: step t's beside obs t, the last repeated beside obs T
    # (Minari 0.5's arrow reader cannot decode per-step scalars: progress and speed are stored (T + 1, 1))
    infos = {key: np.concatenate([v, v[-1:]]).astype(np.float32).reshape(n + 1, -1) for key, v in steps.items()}
    return EpisodeBuffer(
        id=index,
        seed=int(episode.seed),
        observations=observations,
        actions=episode.action.astype(np.float32),
        rewards=list(map(float, episode.reward)),
        terminations=list(terminated),
        truncations=list(truncated),
        infos=infos,
    )


def export_minari(data: Path, out: Path, dataset_id: str) -> Path:
    """Write the dataset at `data` as Minari dataset `dataset_id` under `out`; returns its directory."""
    try:
        import gymnasium as gym
        import minari
    except ImportError:
        raise UserError("--format minari needs minari: pip install minari==0.5.4 (the `minari` extra)") from None
    demos = Demonstrations(data)
    if len(demos) == 0:
        raise UserError(f"{data}: no usable episode to export")
    k = demos.frame_stack
    observation_space = gym.spaces.Box(0, 255, (k, 84, 84), np.uint8)
    action_space = gym.spaces.Box(np.array([-1, 0, 0], np.float32), np.array([1, 1, 1], np.float32))
    target = Path(out) / dataset_id
    if target.exists():
        raise UserError(f"{target} already exists: choose another --out or --dataset-id")
    previous = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(Path(out).resolve())
    try:
        buffers = [_buffer(episode, i) for i, episode in enumerate(demos)]
        minari.create_dataset_from_buffers(
            dataset_id,
            buffers,
            observation_space=observation_space,
            action_space=action_space,
            algorithm_name=f"drive collect (expert {demos.settings['expert']}, "
            f"DART noise {demos.settings['action_noise']})",
            description=f"drive demonstrations from {portable(str(Path(data).resolve()))}: frame stacks of {k} coded "
            f"frames ({demos.frame_coding}); infos['label'] is the clean expert action",
            data_format="arrow",
        )
    except ValueError as exc:
        shutil.rmtree(target, ignore_errors=True)  # no half-written dataset left behind
        raise UserError(f"minari: {exc}") from None
    finally:
        if previous is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = previous
    return target
