"""DAgger (Ross, Gordon & Bagnell 2011) on top of `drive collect` demonstrations.

Why: a clone of the pursuit expert trained on its demonstrations (DART noise included) drifts to speeds the expert
never reaches — it keeps the mean gas of the expert's bang-bang speed control — and then misses the next corner.
The states where it fails are not in the data, so no amount of training on the data fixes it. DAgger puts them in:

1. the trained clone drives (`ckpt:PATH`); at each step, with probability `beta`, the expert's action is executed
   instead (the mixture keeps the car near the track while the clone's own drift still shows);
2. the expert labels every visited state (its action on `info["state"]`, the clone's shadow expert);
3. the new episodes are written in the demonstrations format (datasets/demonstrations.py: the executed action in
   `action`, the expert's label in `label`; frames coded as the source dataset codes them) into a new dataset
   directory that also holds the original episodes (hard links, or copies across file systems), so `drive train
   --data OUT` trains on the aggregate.

Uncertainty-gated DAgger (`query_quantile`): the same mixture drives, but the expert is queried only on states
where the clone's steering epistemic variance exceeds a threshold (that quantile of it on the clone's nominal laps,
--calibrate-seeds); the other steps are recorded with a NaN label, which training skips (their frames still serve
the stacks of labelled neighbours). Every episode record counts its `labels`, so a curve of closed-loop return
against expert labels compares gated with plain rounds.

Episodes are never flagged by return here (a clone's low return is the point; the labels are the expert's); the
manifest's episode records carry `dagger: true` and the settings name the source dataset, clone, expert and beta.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from datasets.demonstrations import (
    EPISODE_DIR,
    MANIFEST,
    Demonstrations,
    read_manifest,
    write_episode,
    write_manifest,
)
from datasets.files import clean_temp
from datasets.frames import LEGACY_CODING
from datasets.root import portable
from drive.errors import UserError
from drive.loop.collect import intact, lock, record_lanes
from drive.loop.envs import make_env
from drive.loop.fallback import FallbackConfig
from drive.loop.lanes import cached_lanes, cars_per_process, episodes_in
from drive.loop.options import DaggerOptions
from drive.loop.policies import ControllerPolicy
from drive.loop.pool import run_tasks
from drive.loop.rollout import EpisodeResult, Lane, PolicyOutput
from drive.loop.seeds import parse_seeds
from drive.loop.specs import PolicySpec
from drive.loop.thresholds import resolve_threshold

log = logging.getLogger(__name__)


class MixedPolicy:
    """Executes the clone's action, or with probability beta the expert's; always labels with the expert's."""

    def __init__(self, clone: ControllerPolicy, beta: float, seed: int = 0, query_threshold: float | None = None):
        if clone.shadow is None:
            raise ValueError("DAgger needs the clone's shadow expert: it labels every state")
        if not 0.0 <= beta <= 1.0:
            raise UserError(f"beta must lie in [0, 1], got {beta}")
        self.clone, self.beta, self.seed, self.query_threshold = clone, beta, seed, query_threshold
        self._rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None) -> None:
        self.clone.reset(seed)
        self._rng = np.random.default_rng([self.seed, 0 if seed is None else int(seed)])

    @property
    def lane_inner(self) -> ControllerPolicy:
        return self.clone

    def act(self, obs: Any, info: Any) -> PolicyOutput:
        return self.wrap(self.clone.act(obs, info))

    def wrap(self, out: PolicyOutput) -> PolicyOutput:
        """The clone's step -> the executed one (the expert's with probability beta) and its label."""
        assert out.expert is not None
        expert = np.asarray(out.expert, np.float32)
        use_expert = self._rng.random() < self.beta
        label = expert
        if self.query_threshold is not None:
            assert out.prediction is not None
            if not float(out.prediction.epistemic_var[0]) > self.query_threshold:
                label = np.full_like(expert, np.nan)  # not queried: no expert label for this state
        return PolicyOutput(
            expert if use_expert else out.action,
            label,
            "expert" if use_expert else "policy",
            out.prediction,
            out.internals,
            out.expert,
            out.latency_ms,
            out.gate,
            out.frame,
        )


_CACHE: dict[Any, list[Lane]] = {}  # per process: settings -> its lanes (one clone), built once per worker


def dagger_episodes(
    root: str,
    settings: dict[str, Any],
    seeds: list[int],
    tick: Callable[[int], None] | None = None,
    recorder: Callable[[dict[str, Any]], Any] | None = None,
) -> list[dict[str, Any]]:
    """One DAgger episode per seed, len(seeds) cars at once (one clone call per step); each shard is written as its
    episode ends. Returns the manifest records in seed order."""

    def policy() -> MixedPolicy:
        spec: PolicySpec = settings["policy"]
        return MixedPolicy(spec.build(), settings["beta"], spec.seed, settings.get("query_threshold"))

    def lane(p: Any) -> Lane:
        return Lane(make_env(settings["env"], max_episode_steps=settings["max_episode_steps"]), p)

    lanes = cached_lanes(_CACHE, tuple(sorted(settings.items())), len(seeds), policy, lane)
    assert recorder is not None, "dagger_episodes needs the recorder factory"

    def record_of(result: EpisodeResult, episode: Any) -> dict[str, Any]:
        record = result.to_dict()
        arrays = episode.arrays()
        record.update(
            write_episode(root, result.seed, arrays),
            flagged=False,
            dagger=True,
            labels=int(np.isfinite(arrays["label"]).all(1).sum()),
        )
        return record

    return record_lanes(lanes, seeds, tick, lambda: recorder(settings), record_of)


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def validate(opts: DaggerOptions) -> tuple[dict[str, Any], list[int]]:
    """Everything checked before --out is touched: options, the clone, the source dataset read in full (its hashes:
    a corrupt shard is never linked into a new dataset). Returns the source manifest and the new seeds."""
    if not 0.0 <= opts.beta <= 1.0:
        raise UserError(f"--beta {opts.beta}: must lie in [0, 1]")
    if opts.workers < 1 or opts.max_episode_steps < 1:
        raise UserError("--workers and --max-episode-steps must be >= 1")
    if opts.query_quantile is not None and not 0.0 < opts.query_quantile < 1.0:
        raise UserError(f"--query-quantile {opts.query_quantile}: must lie in (0, 1)")
    seeds = parse_seeds(opts.seeds)
    source = Demonstrations(opts.data, include_flagged=True, verify=True)
    for _ in source:  # every shard's sha256 against the manifest: DemonstrationError naming the first bad one
        pass
    clash = sorted(set(seeds) & {int(e["seed"]) for e in source.manifest["episodes"]})
    if clash:
        raise UserError(f"--seeds {clash} already in {opts.data}: choose other track seeds")
    clone_spec(opts).build()  # a bad clone fails here
    return source.manifest, seeds


def clone_spec(opts: DaggerOptions) -> PolicySpec:
    """The clone that drives, its shadow the expert that labels."""
    return PolicySpec("ckpt", str(opts.ckpt), opts.env, opts.samples, opts.seed, shadow=opts.expert)


def _plan(opts: DaggerOptions, seeds: list[int], threshold: float | None) -> dict[str, Any]:
    # paths relative to the working directory: the dataset names no folder of the machine that made it
    return {
        "source": portable(str(Path(opts.data).resolve())),
        "ckpt": portable(str(Path(opts.ckpt).resolve())),
        "expert": opts.expert,
        "beta": opts.beta,
        "seeds": seeds,
        "query_quantile": opts.query_quantile,
        "query_threshold": threshold,
        "samples": opts.samples,
        "seed": opts.seed,
        "max_episode_steps": opts.max_episode_steps,
        "env": opts.env,
    }


def _resumable(root: Path, opts: DaggerOptions, seeds: list[int]) -> dict[str, Any] | None:
    """The manifest of an earlier run of the same command into --out (None: --out is new); anything else refused."""
    if not root.exists():
        return None
    if not (root / MANIFEST).is_file():
        if any(p.name not in (EPISODE_DIR, ".collect.lock") and ".tmp" not in p.name for p in root.iterdir()):
            raise UserError(f"{root} exists and is not a DAgger dataset: DAgger writes a new dataset directory")
        return None  # killed before its first manifest: start again
    manifest = read_manifest(root)
    old = manifest["settings"].get("dagger")
    new = _plan(opts, seeds, old.get("query_threshold") if isinstance(old, dict) else None)
    if not isinstance(old, dict) or {k: old.get(k) for k in new} != new:
        differ = sorted(k for k in new if not isinstance(old, dict) or old.get(k) != new[k])
        raise UserError(
            f"{root} exists and holds another dataset (differs in {', '.join(differ) or 'kind'}): "
            "use another --out (DAgger resumes only the same command)"
        )
    return manifest


def aggregate(opts: DaggerOptions, recorder: Callable[[dict[str, Any]], Any]) -> list[dict[str, Any]]:
    """Drive the DAgger episodes into a new dataset beside the source's episodes; returns the records recorded by
    this call. Rerunning the same command resumes a stopped run (finished episodes kept, the rest recorded); the
    manifest lists the seeds still pending, so an unfinished dataset is refused by readers, not trained on."""
    source, seeds = validate(opts)
    root = Path(opts.out)
    earlier = _resumable(root, opts, seeds)
    threshold = earlier["settings"]["dagger"]["query_threshold"] if earlier else opts.query_threshold
    if opts.query_quantile is not None and threshold is None:
        cfg = FallbackConfig(signal="steer", quantile=opts.query_quantile)
        env_kwargs = {"name": opts.env, "max_episode_steps": opts.max_episode_steps}
        threshold, origin = resolve_threshold(
            opts.ckpt, cfg, None, parse_seeds(opts.calibrate_seeds), opts.samples, opts.seed, env_kwargs
        )
        log.info("gated DAgger: query threshold %.4g (%s)", threshold, origin)
    (root / EPISODE_DIR).mkdir(parents=True, exist_ok=True)
    handle = lock(root)
    try:
        for folder in (root, root / EPISODE_DIR):
            clean_temp(folder)
        settings = {**source["settings"], "dagger": _plan(opts, seeds, threshold)}
        episodes = []
        for ep in source["episodes"]:
            if not (root / ep["file"]).is_file():
                _link(Path(opts.data) / ep["file"], root / ep["file"])
            episodes.append(ep)
        done = {int(e["seed"]): e for e in (earlier or {}).get("episodes", []) if e.get("dagger")}
        done = {s: e for s, e in done.items() if intact(root, e)}
        todo = [s for s in seeds if s not in done]
        if len(todo) < len(seeds):
            log.info("resuming %s: %d of %d DAgger episodes already recorded", root, len(seeds) - len(todo), len(seeds))
        write_manifest(root, settings, episodes + list(done.values()), todo)
        job = {
            "policy": clone_spec(opts),
            "beta": opts.beta,
            "max_episode_steps": opts.max_episode_steps,
            "env": opts.env,
            "frame_stack": int(source["settings"].get("frame_stack", 4)),
            "frame_coding": str(source["settings"].get("frame_coding", LEGACY_CODING)),
            "keep_raw": bool(source["settings"].get("keep_raw", False)),
            "query_threshold": threshold,
        }
        new: list[dict[str, Any]] = []

        def finished(records: list[dict[str, Any]]) -> None:  # a task's episodes
            for record in records:
                new.append(record)
                done[int(record["seed"])] = record
            write_manifest(root, settings, episodes + list(done.values()), [s for s in seeds if s not in done])
            log.info("seed %d: clone+expert return %.1f, %d steps", record["seed"], record["return"], record["steps"])

        k = cars_per_process(opts.envs, len(todo), opts.workers)
        tasks = [(str(root), job, todo[i : i + k]) for i in range(0, len(todo), k)]
        run_tasks(
            dagger_episodes, tasks, opts.workers, finished, opts.progress, "dagger", extra=(recorder,), size=episodes_in
        )
        return new
    finally:
        handle.close()
