"""Recording expert demonstrations in the pixel env: resumable, one episode per worker task.

Per step the recorder (drive/observe/demonstrations.py) stores the frame coded once with `frame_coding` (the
coding `drive train` reads by default), the expert's clean action (the label), the executed action (DART: label +
Gaussian noise of std `action_noise`, clipped), the privileged state, reward, progress, speed, pose, off-track,
and with `keep_raw` the raw 96x96 RGB frame. The format (one .npz shard per episode + manifest.json) is documented
in `datasets/demonstrations.py`.

Crash safety: shards and the manifest are written atomically (temp + fsync + rename) and the manifest is rewritten
after every finished task (one episode with the default `--envs 1`; with K cars per process a task's K episodes
enter it together), so a run killed at any moment loses at most the tasks in flight; rerunning the same command
skips the finished seeds. The DART noise is seeded per episode from (seed, noise_seed), so a redone episode
is the same episode. A lock file keeps two writers off one directory. A rerun with another `--min-return` (a label,
not a recording setting) re-flags the finished episodes by their recorded returns and records nothing again.
"""

from __future__ import annotations

import fcntl
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from datasets.demonstrations import EPISODE_DIR, MANIFEST, read_manifest, write_episode, write_manifest
from datasets.files import clean_temp
from datasets.frames import FRAME_CODINGS
from drive.errors import UserError
from drive.loop.envs import ENVS, make_env
from drive.loop.lanes import AUTO_COLLECT_ENVS, act_lanes, cached_lanes, cars_per_process, episodes_in
from drive.loop.options import CollectOptions
from drive.loop.policies import NoisyPolicy
from drive.loop.pool import Ticker, check_ray, run_tasks
from drive.loop.rollout import EpisodeResult, Lane, run_lanes
from drive.loop.seeds import parse_seeds
from drive.loop.specs import expert_policy

log = logging.getLogger(__name__)

# settings that shape the recorded data: a resumed run must match them exactly
DATA_SETTINGS = ("env", "expert", "action_noise", "noise_seed", "frame_stack", "frame_coding", "max_episode_steps",
                 "keep_raw", "fast_render")  # fmt: skip
# settings that only label the recorded data: a rerun with another value re-labels what is there (nothing recorded
# again); min_return flags episodes whose return fell below it
LABEL_SETTINGS = ("min_return",)


def seed_list(opts: CollectOptions) -> list[int]:
    if opts.episodes is not None and opts.episodes < 1:
        raise UserError(f"--episodes must be >= 1, got {opts.episodes}")
    if opts.seeds is None:
        if opts.episodes is None:
            raise UserError("give --episodes N and/or --seeds A-B")
        return list(range(opts.episodes))
    seeds = parse_seeds(opts.seeds)
    if opts.episodes is not None:
        if opts.episodes > len(seeds):
            raise UserError(f"--episodes {opts.episodes} but --seeds {opts.seeds!r} names only {len(seeds)} seeds")
        seeds = seeds[: opts.episodes]
    return seeds


def validate(opts: CollectOptions) -> list[int]:
    """Every option checked before anything is written; returns the seeds to record."""
    seeds = seed_list(opts)
    if opts.workers < 1:
        raise UserError(f"--workers must be >= 1, got {opts.workers}")
    if opts.env not in ENVS:
        raise UserError(f"--env {opts.env!r}: choose one of {ENVS}")
    if opts.frame_coding not in FRAME_CODINGS:
        raise UserError(f"--frame-coding {opts.frame_coding!r}: choose one of {sorted(FRAME_CODINGS)}")
    if opts.action_noise < 0 or opts.frame_stack < 1 or opts.max_episode_steps < 1:
        raise UserError("--action-noise must be >= 0, --frame-stack and --max-episode-steps >= 1")
    expert_policy(opts.expert, opts.env)  # a bad expert fails here, before the directory exists
    check_ray(opts.ray)
    return seeds


def settings_of(opts: CollectOptions) -> dict[str, Any]:
    return {key: getattr(opts, key) for key in (*DATA_SETTINGS, *LABEL_SETTINGS)}


_CACHE: dict[Any, list[Lane]] = {}  # per process: settings -> its lanes, built once per worker


def _lanes(settings: dict[str, Any], k: int) -> list[Lane]:
    def policy() -> NoisyPolicy:
        space = make_env(settings["env"], max_episode_steps=1).action_space
        expert = expert_policy(settings["expert"], settings["env"])
        return NoisyPolicy(expert, settings["action_noise"], space.low, space.high, settings["noise_seed"])  # type: ignore[attr-defined]

    def lane(p: Any) -> Lane:
        return Lane(
            make_env(
                settings["env"], max_episode_steps=settings["max_episode_steps"], fast_render=settings["fast_render"]
            ),
            p,
        )

    return cached_lanes(_CACHE, tuple(sorted(settings.items())), k, policy, lane)


RecorderFactory = Callable[[dict[str, Any]], Any]


def record_lanes(
    lanes: list[Lane],
    seeds: list[int],
    tick: Callable[[int], None] | None,
    new_recorder: Callable[[], Any],
    record_of: Callable[[EpisodeResult, Any], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Drive one episode per seed on the lanes, each observed by a fresh recorder; `record_of(result, recorder)`
    writes an episode's shard the moment it ends and returns its manifest record. Records in seed order."""
    ticker = Ticker(tick)
    runs = [Lane(lane.env, lane.policy, [new_recorder(), ticker]) for lane in lanes]
    records: dict[int, dict[str, Any]] = {}

    def finished(j: int, result: EpisodeResult) -> None:
        records[result.seed] = record_of(result, runs[j].observers[0])
        runs[j].observers = [new_recorder(), ticker]

    run_lanes(runs, seeds, act_lanes, finished)
    return [records[seed] for seed in seeds]


def collect_episodes(
    root: str,
    settings: dict[str, Any],
    seeds: list[int],
    tick: Callable[[int], None] | None = None,
    recorder: RecorderFactory | None = None,
) -> list[dict[str, Any]]:
    """Drive one episode per seed, len(seeds) cars at once; write each shard atomically as its episode ends; return
    their manifest records. `tick(n)`: n more frames done."""
    assert recorder is not None, "collect_episodes needs the recorder factory"

    def record_of(result: EpisodeResult, episode: Any) -> dict[str, Any]:
        record = result.to_dict()
        record.update(
            write_episode(root, result.seed, episode.arrays()), flagged=bool(result.return_ < settings["min_return"])
        )
        return record

    return record_lanes(_lanes(settings, len(seeds)), seeds, tick, lambda: recorder(settings), record_of)


def lock(root: Path) -> IO[str]:
    """An exclusive lock on the dataset directory (released when the returned file is closed)."""
    fh = open(root / ".collect.lock", "w")  # noqa: SIM115 - the caller closes it
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise UserError(f"{root}: another process is writing this dataset directory") from None
    return fh


def finished_episodes(root: Path, settings: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Finished episodes of an earlier run into the same directory (after checking it used the same settings)."""
    if not (root / MANIFEST).exists():
        return {}
    old = read_manifest(root)["settings"]
    diff = {k: (old.get(k), settings[k]) for k in DATA_SETTINGS if old.get(k) != settings[k]}
    if diff:
        detail = ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
        raise UserError(f"{root / MANIFEST} was recorded with other settings ({detail}); use another --out")
    return {int(ep["seed"]): ep for ep in read_manifest(root)["episodes"] if intact(root, ep)}


def reflag(done: dict[int, dict[str, Any]], min_return: float) -> bool:
    """Flag each finished episode by its recorded return against `min_return` (in place); True if any changed."""
    changed = False
    for seed, episode in done.items():
        flagged = bool(episode["return"] < min_return)
        if bool(episode["flagged"]) != flagged:
            done[seed], changed = {**episode, "flagged": flagged}, True
    return changed


def relabelled(root: Path, settings: dict[str, Any]) -> bool:
    """The dataset was labelled with other LABEL_SETTINGS than this run's (e.g. another --min-return)."""
    old = read_manifest(root)["settings"]
    return any(old.get(k) != settings[k] for k in LABEL_SETTINGS)


def intact(root: Path, episode: dict[str, Any]) -> bool:
    """A finished episode a resumed run keeps: its shard is there with the manifest's size (else recorded again)."""
    path = root / episode["file"]
    if path.is_file() and path.stat().st_size == episode["bytes"]:
        return True
    log.warning(
        "%s: listed in the manifest but missing or the wrong size; recording seed %s again", path, episode["seed"]
    )
    return False


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


def collect(opts: CollectOptions, recorder: RecorderFactory) -> Summary:
    """Record the episodes of `opts` into opts.out (resuming); `recorder(settings)` builds each episode's observer."""
    seeds = validate(opts)
    root = Path(opts.out)
    settings = settings_of(opts)
    if (root / MANIFEST).exists():
        finished_episodes(root, settings)  # other settings: refused before anything is touched
    (root / EPISODE_DIR).mkdir(parents=True, exist_ok=True)
    handle = lock(root)
    try:
        for folder in (root, root / EPISODE_DIR):
            clean_temp(folder)
        done = finished_episodes(root, settings)
        todo = [s for s in seeds if s not in done]
        if reflag(done, settings["min_return"]) or ((root / MANIFEST).exists() and relabelled(root, settings)):
            write_manifest(root, settings, list(done.values()), todo)  # another --min-return: the flags follow it
        if len(todo) < len(seeds):
            log.info("resuming %s: %d of %d episodes already recorded", root, len(seeds) - len(todo), len(seeds))
        start = time.perf_counter()
        new: list[dict[str, Any]] = []

        def finished(records: list[dict[str, Any]]) -> None:  # a task's episodes
            for record in records:
                done[int(record["seed"])] = record
                new.append(record)
            write_manifest(root, settings, list(done.values()), [s for s in seeds if s not in done])

        if todo:  # the directory says it is incomplete until the last episode lands
            write_manifest(root, settings, list(done.values()), todo)
        k = cars_per_process(opts.envs, len(todo), opts.workers, AUTO_COLLECT_ENVS)
        tasks = [(str(root), settings, todo[i : i + k]) for i in range(0, len(todo), k)]
        run_tasks(
            collect_episodes,
            tasks,
            opts.workers,
            finished,
            show=opts.progress,
            label="collect",
            extra=(recorder,),
            ray=opts.ray,
            size=episodes_in,
        )
        if not (root / MANIFEST).exists() or read_manifest(root).get("pending"):
            write_manifest(root, settings, list(done.values()))
        return Summary(root, seeds, new, len(seeds) - len(todo), time.perf_counter() - start)
    finally:
        handle.close()
