"""DAgger (Ross, Gordon & Bagnell 2011) on top of `drive collect` demonstrations: `drive dagger ...`.

Why: a clone of the pursuit expert trained on its demonstrations (DART noise included) drifts to speeds the expert
never reaches — it keeps the mean gas of the expert's bang-bang speed control — and then misses the next corner.
The states where it fails are not in the data, so no amount of training on the data fixes it. DAgger puts them in:

1. the trained clone drives (`ckpt:PATH`); at each step, with probability `beta`, the expert's action is executed
   instead (the mixture keeps the car near the track while the clone's own drift still shows);
2. the expert labels every visited state (its action on `info["state"]`, the shadow expert of drive/policies.py);
3. the new episodes are written in the demonstrations format (datasets/demonstrations.py: the executed action in
   `action`, the expert's label in `label`) into a new dataset directory that also holds the original episodes
   (hard links, or copies across file systems), so `drive train --data OUT` trains on the aggregate.

Episodes are never flagged by return here (a clone's low return is the point; the labels are the expert's); the
manifest's episode records carry `dagger: true` and the settings name the source dataset, clone, expert and beta.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tyro

from datasets.demonstrations import EPISODE_DIR, read_manifest, write_episode, write_manifest
from drive.collect import Recorder
from drive.policies import ControllerPolicy, load_controller_policy
from drive.pool import Ticker, run_tasks
from drive.rollout import PolicyOutput, make_env, parse_seeds, rollout

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    ckpt: Path
    """the clone that drives (a `drive train` checkpoint)"""
    data: Path
    """the demonstrations to aggregate with (their episodes are linked into --out)"""
    out: Path
    """the aggregated dataset directory (must not exist)"""
    seeds: str
    """track seeds of the new episodes (keep them apart from the data's and from evaluation seeds)"""
    expert: str = "pursuit"
    """the expert that labels (ppo, pursuit or an expert checkpoint path)"""
    beta: float = 0.3
    """probability per step that the expert's action is executed instead of the clone's"""
    samples: int | None = None
    """the clone's stochastic samples per step (default: its own)"""
    workers: int = 2
    """parallel worker processes, one episode per task"""
    max_episode_steps: int = 1000
    """step limit per episode"""
    seed: int = 0
    """seed of the mixing coin and the clone's sampling"""
    env: Literal["carracing", "fake-road"] = "carracing"
    """simulator: carracing, or fake-road (tests; its expert is 'pursuit')"""
    progress: bool = True
    """show a progress bar"""


class MixedPolicy:
    """Executes the clone's action, or with probability beta the expert's; always labels with the expert's."""

    def __init__(self, clone: ControllerPolicy, beta: float, seed: int = 0):
        if clone.shadow is None:
            raise ValueError("DAgger needs the clone's shadow expert: it labels every state")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must lie in [0, 1], got {beta}")
        self.clone, self.beta, self.seed = clone, beta, seed
        self.needs_raw = clone.needs_raw
        self._rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None) -> None:
        self.clone.reset(seed)
        self._rng = np.random.default_rng([self.seed, 0 if seed is None else int(seed)])

    def act(self, obs: Any, info: Any) -> PolicyOutput:
        out = self.clone.act(obs, info)
        expert = np.asarray(out.extras["expert"], np.float32)
        use_expert = self._rng.random() < self.beta
        return PolicyOutput(expert if use_expert else out.action, label=expert,
                            source="expert" if use_expert else "policy", extras=out.extras)  # fmt: skip


_CACHE: dict[tuple, tuple] = {}


def dagger_episode(root: str, settings: dict[str, Any], seed: int, tick=None) -> dict[str, Any]:
    key = tuple(sorted(settings.items()))
    if key not in _CACHE:
        _CACHE.clear()
        clone = load_controller_policy(
            settings["ckpt"], settings["samples"], settings["seed"], settings["expert"], env=settings["env"]
        )
        env = make_env(settings["env"], keep_raw=True, max_episode_steps=settings["max_episode_steps"])
        _CACHE[key] = (env, MixedPolicy(clone, settings["beta"], settings["seed"]))
    env, policy = _CACHE[key]
    recorder = Recorder(frame_stack=4, keep_raw=True)
    [result] = rollout(env, policy, seeds=[seed], on_step=[recorder, Ticker(tick)])
    record = result.to_dict()
    record.update(write_episode(root, seed, recorder.arrays()), flagged=False, dagger=True)
    return record


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def aggregate(cfg: Config) -> list[dict[str, Any]]:
    source = read_manifest(cfg.data)
    if int(source["settings"].get("frame_stack", 4)) != 4 or not source["settings"].get("keep_raw"):
        raise ValueError(f"{cfg.data}: DAgger aggregates frame-stack-4 datasets recorded with --keep-raw")
    seeds = parse_seeds(cfg.seeds)
    clash = sorted(set(seeds) & {int(e["seed"]) for e in source["episodes"]})
    if clash:
        raise ValueError(f"--seeds {clash} already in {cfg.data}: choose other track seeds")
    root = Path(cfg.out)
    if root.exists():
        raise ValueError(f"{root} exists: DAgger writes a new dataset directory")
    (root / EPISODE_DIR).mkdir(parents=True)
    episodes = []
    for ep in source["episodes"]:
        _link(Path(cfg.data) / ep["file"], root / ep["file"])
        episodes.append(ep)
    settings = {**source["settings"], "dagger": {"source": str(Path(cfg.data).resolve()), "ckpt": str(cfg.ckpt),
                                                 "expert": cfg.expert, "beta": cfg.beta, "seeds": seeds}}  # fmt: skip
    write_manifest(root, settings, episodes)
    job = {"ckpt": str(cfg.ckpt), "samples": cfg.samples, "seed": cfg.seed, "expert": cfg.expert,
           "beta": cfg.beta, "max_episode_steps": cfg.max_episode_steps, "env": cfg.env}  # fmt: skip
    new: list[dict[str, Any]] = []

    def finished(record: dict[str, Any]) -> None:
        new.append(record)
        write_manifest(root, settings, episodes + new)
        log.info("seed %d: clone+expert return %.1f, %d steps", record["seed"], record["return"], record["steps"])

    run_tasks(dagger_episode, [(str(root), job, s) for s in seeds], cfg.workers, finished, cfg.progress, "dagger")
    return new


def run(cfg: Config) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        new = aggregate(cfg)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"drive dagger: error: {exc}", file=sys.stderr)
        return 2
    returns = [r["return"] for r in new]
    print(f"{len(new)} DAgger episode(s) ({sum(r['steps'] for r in new)} frames, mean return under the mixture "
          f"{np.mean(returns):.1f}) + the {len(read_manifest(cfg.out)['episodes']) - len(new)} episodes of "
          f"{cfg.data} -> {cfg.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(run(tyro.cli(Config)))
