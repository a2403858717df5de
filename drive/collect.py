"""`drive collect`: record expert demonstrations in the pixel env, resumable, one episode per worker task.

Per step: the controller's 84x84 frame (each frame stored once; the reader rebuilds the stacks), the expert's clean
action (the label), the executed action (DART: label + Gaussian noise of std `action_noise`, clipped), the privileged
state, reward, progress, speed, pose, off-track, and optionally the raw 96x96 RGB frame. Per episode: seed, return,
completion, steps, flagged. The format (one .npz shard per episode + manifest.json) is documented in
`datasets/demonstrations.py`.

Crash safety: shards and the manifest are written atomically (temp + fsync + rename) and the manifest is rewritten
after every finished episode, so a run killed at any moment loses at most the episodes in flight; rerunning the same
command skips the finished seeds. The DART noise is seeded per episode from (seed, noise_seed), so a redone episode
is the same episode. A lock file keeps two writers off one directory.
"""

from __future__ import annotations

import fcntl
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from datasets.demonstrations import EPISODE_DIR, MANIFEST, read_manifest, write_episode, write_manifest
from drive.pool import Ticker, run_tasks
from drive.rollout import NoisyPolicy, StepRecord, load_expert_policy, make_env, parse_seeds, rollout

log = logging.getLogger(__name__)

# settings that shape the recorded data: a resumed run must match them exactly
DATA_SETTINGS = (
    "env",
    "expert",
    "action_noise",
    "noise_seed",
    "frame_stack",
    "max_episode_steps",
    "keep_raw",
    "fast_render",
    "min_return",
)


@dataclass(frozen=True)
class Config:
    out: Path
    """dataset directory; created if new, resumed if it holds a dataset recorded with the same settings"""
    expert: str = "ppo"
    """expert that drives: ppo (shipped), pursuit (scripted), or a path to an expert checkpoint"""
    episodes: int | None = None
    """number of episodes (default: one per seed in --seeds); without --seeds the seeds are 0..N-1"""
    seeds: str | None = None
    """track seeds: 'A-B' (inclusive), 'A,B,C' or a mix; with --episodes N the first N are used"""
    action_noise: float = 0.0
    """DART noise: std of the Gaussian added to the executed action (clipped); the label stays the clean action"""
    noise_seed: int = 0
    """seed of the DART noise stream (mixed with each track seed)"""
    workers: int = 1
    """parallel worker processes, one episode per task (1 runs in this process)"""
    keep_raw: bool = False
    """also store the env's raw 96x96 RGB frame per step (about 3.5x the size)"""
    min_return: float = 700.0
    """episodes returning less are flagged and left out by readers unless asked for (700: a clean lap's floor)"""
    max_episode_steps: int = 1000
    """step limit per episode (CarRacing-v3's is 1000)"""
    frame_stack: int = 4
    """frames in the controller's observation stack"""
    fast_render: bool = True
    """use the bridge's fast renderer (pixel-identical to stock CarRacing)"""
    env: Literal["carracing", "fake-road"] = "carracing"
    """simulator: carracing, or fake-road (a tiny synthetic road for tests; its expert is 'pursuit')"""
    progress: bool = True
    """show a progress bar with frames/s"""


def seed_list(cfg: Config) -> list[int]:
    if cfg.seeds is None:
        if cfg.episodes is None:
            raise ValueError("give --episodes N and/or --seeds A-B")
        return list(range(cfg.episodes))
    seeds = parse_seeds(cfg.seeds)
    if cfg.episodes is not None:
        if cfg.episodes > len(seeds):
            raise ValueError(f"--episodes {cfg.episodes} but --seeds {cfg.seeds!r} names only {len(seeds)} seeds")
        seeds = seeds[: cfg.episodes]
    return seeds


def settings_of(cfg: Config) -> dict[str, Any]:
    return {key: getattr(cfg, key) for key in DATA_SETTINGS}


# -- one episode (runs in a worker or in this process) ---------------------------------------------------------------
class Recorder:
    """Observer that accumulates one episode's arrays, storing each frame once."""

    def __init__(self, frame_stack: int, keep_raw: bool):
        self.k, self.keep_raw = frame_stack, keep_raw
        self.frames: list[np.ndarray] = []
        self.steps: dict[str, list] = {
            key: [] for key in ("label", "action", "state", "reward", "progress", "speed", "pose", "off_track", "raw")
        }

    def __call__(self, rec: StepRecord) -> None:
        obs = np.asarray(rec.obs)
        if obs.shape[0] != self.k:
            raise ValueError(f"expected a ({self.k}, H, W) frame stack, got observation shape {obs.shape}")
        if rec.t == 0:
            self.frames.extend(obs[:-1].copy())  # the reset stack's padding
        elif not np.array_equal(obs[:-1], np.stack(self.frames[-(self.k - 1) :])):
            # The reader rebuilds stacks as a sliding window over stored frames; refuse an env that stacks otherwise.
            raise ValueError(f"seed {rec.seed} step {rec.t}: the frame stack is not a sliding window over frames")
        self.frames.append(obs[-1].copy())  # copies: an env may reuse its buffers
        s = self.steps
        s["label"].append(rec.label)
        s["action"].append(rec.action)
        s["state"].append(np.array(rec.info["state"], np.float32))
        s["reward"].append(rec.reward)
        s["progress"].append(rec.next_info.get("progress", np.nan))
        s["speed"].append(rec.info.get("speed", np.nan))
        s["pose"].append(rec.info.get("pose", np.full(3, np.nan)))
        s["off_track"].append(bool(rec.next_info.get("off_track", False)))
        if self.keep_raw:
            s["raw"].append(np.array(rec.info["raw_frame"], np.uint8))

    def arrays(self) -> dict[str, np.ndarray]:
        s = self.steps
        out = {
            "frames": np.stack(self.frames).astype(np.uint8),  # (T + k - 1, 84, 84)
            "label": np.asarray(s["label"], np.float32),  # (T, 3)
            "action": np.asarray(s["action"], np.float32),  # (T, 3)
            "state": np.asarray(s["state"], np.float32),  # (T, S)
            "reward": np.asarray(s["reward"], np.float32),  # (T,)
            "progress": np.asarray(s["progress"], np.float32),  # (T,)
            "speed": np.asarray(s["speed"], np.float32),  # (T,)
            "pose": np.asarray(s["pose"], np.float32),  # (T, 3)
            "off_track": np.asarray(s["off_track"], bool),  # (T,)
        }
        if self.keep_raw:
            out["raw"] = np.asarray(s["raw"], np.uint8)  # (T, 96, 96, 3)
        return out


_CACHE: dict[tuple, tuple] = {}  # per process: settings -> (env, policy), built once per worker


def _env_and_policy(settings: dict[str, Any]):
    key = tuple(sorted(settings.items()))
    if key not in _CACHE:
        _CACHE.clear()
        env = make_env(
            settings["env"],
            keep_raw=settings["keep_raw"],
            frame_stack=settings["frame_stack"],
            max_episode_steps=settings["max_episode_steps"],
            fast_render=settings["fast_render"],
        )
        expert = load_expert_policy(settings["expert"], settings["env"])
        space = env.action_space
        policy = NoisyPolicy(expert, settings["action_noise"], space.low, space.high, settings["noise_seed"])
        _CACHE[key] = (env, policy)
    return _CACHE[key]


def collect_episode(root: str, settings: dict[str, Any], seed: int, tick=None) -> dict[str, Any]:
    """Drive one episode, write its shard atomically, return its manifest record. `tick(n)`: n more frames done."""
    env, policy = _env_and_policy(settings)
    recorder = Recorder(settings["frame_stack"], settings["keep_raw"])
    [result] = rollout(env, policy, seeds=[seed], on_step=[recorder, Ticker(tick)])
    files = write_episode(root, seed, recorder.arrays())
    record = result.to_dict()
    record.update(files, flagged=bool(result.return_ < settings["min_return"]))
    return record


# -- the run ---------------------------------------------------------------------------------------------------------
def _lock(root: Path):
    fh = open(root / ".collect.lock", "w")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise RuntimeError(f"{root}: another `drive collect` is writing this directory") from None
    return fh


def _resume(root: Path, settings: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Finished episodes of an earlier run into the same directory (after checking it used the same settings)."""
    if not (root / MANIFEST).exists():
        return {}
    manifest = read_manifest(root)
    old = manifest["settings"]
    diff = {k: (old.get(k), settings[k]) for k in DATA_SETTINGS if old.get(k) != settings[k]}
    if diff:
        detail = ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
        raise ValueError(f"{root / MANIFEST} was recorded with other settings ({detail}); use another --out")
    done = {}
    for ep in manifest["episodes"]:
        path = root / ep["file"]
        if path.is_file() and path.stat().st_size == ep["bytes"]:
            done[int(ep["seed"])] = ep
        else:
            log.warning(
                "%s: listed in the manifest but missing or the wrong size; recording seed %s again", path, ep["seed"]
            )
    return done


def _clean_temp(root: Path) -> None:
    for folder in (root, root / EPISODE_DIR):
        for tmp in folder.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class Summary:
    out: Path
    seeds: list[int]
    new: list[dict[str, Any]]  # records of the episodes recorded by this call
    skipped: int  # episodes already finished by an earlier run
    seconds: float

    @property
    def frames(self) -> int:
        return sum(int(r["steps"]) for r in self.new)

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else float("nan")


def collect(cfg: Config) -> Summary:
    seeds = seed_list(cfg)
    if cfg.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {cfg.workers}")
    root = Path(cfg.out)
    (root / EPISODE_DIR).mkdir(parents=True, exist_ok=True)
    settings = settings_of(cfg)
    lock = _lock(root)
    try:
        _clean_temp(root)
        done = _resume(root, settings)
        write_manifest(root, settings, list(done.values()))
        todo = [s for s in seeds if s not in done]
        if len(todo) < len(seeds):
            log.info("resuming %s: %d of %d episodes already recorded", root, len(seeds) - len(todo), len(seeds))
        start = time.perf_counter()
        new = _run_jobs(root, settings, todo, cfg.workers, cfg.progress, done)
        return Summary(root, seeds, new, len(seeds) - len(todo), time.perf_counter() - start)
    finally:
        lock.close()


def _run_jobs(root: Path, settings: dict, todo: list[int], workers: int, show: bool, done: dict) -> list[dict]:
    new: list[dict[str, Any]] = []

    def finished(record: dict[str, Any]) -> None:
        done[int(record["seed"])] = record
        new.append(record)
        write_manifest(root, settings, list(done.values()))
        log.info(
            "seed %d: return %.1f, %d steps%s",
            record["seed"],
            record["return"],
            record["steps"],
            " (flagged)" if record["flagged"] else "",
        )

    tasks = [(str(root), settings, seed) for seed in todo]
    run_tasks(collect_episode, tasks, workers, finished, show=show, label="collect")
    return new


def run(cfg: Config) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        summary = collect(cfg)
    except (ValueError, RuntimeError) as exc:  # bad options, other settings in --out, a locked dir, a failed episode
        print(f"drive collect: error: {exc}", file=sys.stderr)
        return 2
    ds_records = read_manifest(summary.out)["episodes"]
    flagged = [r["seed"] for r in ds_records if r["flagged"]]
    print(
        f"recorded {len(summary.new)} new episode(s), {summary.frames} frames in {summary.seconds:.1f} s "
        f"({summary.fps:.0f} frames/s); {summary.skipped} already there"
    )
    print(
        f"dataset {summary.out}: {len(ds_records)} episode(s), {len(flagged)} flagged (return < {cfg.min_return})"
        + (f": seeds {flagged}" if flagged else "")
    )
    print(f"inspect with: drive data info {summary.out}")
    return 0
