"""`drive bench scale`: the timed runs — `drive collect` on the pool and on Ray with each episode's first and last
step timed, Ray's start apart, `drive train` under torchrun — and the untimed warm-up (the method:
drive/studies/scale/options.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from drive.loop.options import CollectOptions
from drive.studies.scale.options import (
    COLLECTION,
    COLLECTION_RATIOS,
    PER_CPU_RATIOS,
    RAY_START,
    TRAINING,
    WALL_RATIOS,
    ScaleOptions,
)
from drive.studies.scale.rounds import Spread, _load, by_round, round_orders, summarise


class _TimedEpisode:
    """One episode's demonstration recorder, which also notes the wall time and its process's CPU time at the
    episode's first and last step, and writes them, with the process id and steps, to `folder` when it ends."""

    def __init__(self, recorder: Any, folder: str):
        self.recorder, self.folder, self.first, self.first_cpu = recorder, folder, 0.0, 0.0

    def __call__(self, rec: Any) -> None:
        if rec.t == 0:  # wall clock: the same across this machine's processes, Ray's workers included
            self.first, self.first_cpu = time.time(), time.process_time()
        self.recorder(rec)
        if rec.terminated or rec.truncated:
            row = {
                "seed": rec.seed,
                "pid": os.getpid(),
                "first": self.first,
                "last": time.time(),
                "first_cpu": self.first_cpu,
                "last_cpu": time.process_time(),
                "steps": rec.t + 1,
            }
            Path(self.folder, f"{rec.seed}.json").write_text(json.dumps(row))

    def arrays(self) -> Any:
        return self.recorder.arrays()


@dataclass(frozen=True)
class TimedRecorder:
    """The recorder factory `collect` takes (drive/observe/demonstrations.py's), its recorders timed (`_TimedEpisode`):
    how this process learns when the workers took their first step. Picklable, for the pool's and Ray's workers."""

    folder: str

    def __call__(self, settings: dict[str, Any]) -> _TimedEpisode:
        from drive.observe.demonstrations import recorder_for  # torch: not for `--help`

        return _TimedEpisode(recorder_for(settings), self.folder)


@dataclass(frozen=True)
class CollectRun:
    """One timed collection run; times in seconds, from the call to `collect` (`startup_s`) or the run's first env
    step (`stagger_s`: until every worker process stepped; `work_s`: until the last step). `cpu_s`: the CPU time the
    worker processes spent from their first step to their last (what the neighbours on a shared machine cannot
    take: frames per CPU-second is a run's cost, whoever else runs; `cores`, CPU over work, what it was given)."""

    variant: str
    round: int
    frames: int
    startup_s: float
    stagger_s: float
    work_s: float
    wall_s: float  # the whole call: start-up, work and teardown (Ray's shutdown, the pool's join)
    cpu_s: float
    processes: int  # worker processes that drove episodes
    load_before: float
    load_after: float

    @property
    def frames_per_s(self) -> float:
        return self.frames / self.work_s

    @property
    def wall_frames_per_s(self) -> float:
        return self.frames / self.wall_s

    @property
    def startup_share(self) -> float:
        return self.startup_s / self.wall_s

    @property
    def frames_per_cpu_s(self) -> float:
        return self.frames / self.cpu_s

    @property
    def cores(self) -> float:
        return self.cpu_s / self.work_s

    def to_dict(self) -> dict[str, Any]:
        derived = ("frames_per_s", "wall_frames_per_s", "startup_share", "frames_per_cpu_s", "cores")
        return {**asdict(self), **{name: getattr(self, name) for name in derived}}


def timeline(
    variant: str,
    round_: int,
    called: float,
    returned: float,
    episodes: Sequence[dict[str, Any]],
    loads: tuple[float, float],
) -> CollectRun:
    """A run's figures from the call's and return's wall times and its episodes' timing rows (`_TimedEpisode`)."""
    first = min(e["first"] for e in episodes)
    by_process: dict[int, list[dict[str, Any]]] = {}
    for e in episodes:
        by_process.setdefault(e["pid"], []).append(e)
    started = max(min(e["first"] for e in mine) for mine in by_process.values())  # the last process's first step
    cpu = sum(max(e["last_cpu"] for e in mine) - min(e["first_cpu"] for e in mine) for mine in by_process.values())
    return CollectRun(
        variant,
        round_,
        sum(int(e["steps"]) for e in episodes),
        first - called,
        started - first,
        max(e["last"] for e in episodes) - first,
        returned - called,
        cpu,
        len(by_process),
        *loads,
    )


def _options(cfg: ScaleOptions, out: Path, workers: int, on_ray: bool, episodes: int, max_steps: int) -> CollectOptions:
    seeds = f"{cfg.first_seed}-{cfg.first_seed + episodes - 1}"
    return CollectOptions(
        out=out,
        expert=cfg.expert,
        env=cfg.env,
        seeds=seeds,
        workers=workers,
        max_episode_steps=max_steps,
        min_return=-1e9,
        progress=False,
        ray="local" if on_ray else None,
    )


def collect_run(
    cfg: ScaleOptions,
    variant: str,
    round_: int,
    workers: int,
    on_ray: bool,
    episodes: int,
    before: Callable[[], Any] | None = None,
) -> CollectRun:
    """One `drive collect` run of `episodes` episodes, timed; `before()` runs inside the clock, before `collect`."""
    from drive.loop.collect import collect  # torch and the simulator: not for `--help`

    with tempfile.TemporaryDirectory(prefix="bench_scale_") as tmp:
        timing = Path(tmp) / "timing"
        timing.mkdir()
        opts = _options(cfg, Path(tmp) / "data", workers, on_ray, episodes, cfg.max_episode_steps)
        load = _load()
        called = time.time()
        if before is not None:
            before()
        summary = collect(opts, TimedRecorder(str(timing)))
        returned = time.time()
        episodes_timed = [json.loads(p.read_text()) for p in timing.glob("*.json")]
    run = timeline(variant, round_, called, returned, episodes_timed, (load, _load()))
    if len(episodes_timed) != episodes or run.frames != summary.frames:
        raise RuntimeError(
            f"{variant}: {len(episodes_timed)} episode timings for {episodes} episodes "
            f"({run.frames} frames timed, {summary.frames} recorded)"
        )
    return run


def start_ray(cfg: ScaleOptions, round_: int) -> CollectRun:
    """Start the local Ray instance the Ray variants of a round share (2 CPUs, as `drive collect --ray local
    --workers 2` starts it) and warm its two workers with one episode each (imports, env and expert built, then
    cached in the worker); the run's start-up is Ray's: ray.init, the workers' start and their first step."""
    from drive.loop.ray_pool import connect

    return collect_run(cfg, RAY_START, round_, 2, True, 2, before=lambda: connect("local", 2))


def stop_ray() -> None:
    ray = sys.modules.get("ray")  # not imported: never started (and perhaps not installed: `--skip ray`)
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def warm_up(cfg: ScaleOptions, data: Path, console: Any) -> dict[str, float]:
    """Untimed: the training dataset recorded in this process (imports, page cache, numba's kernels, the env and
    expert the 1-worker pool and the pool's forked workers then reuse) and, unless Ray is skipped, a Ray instance
    started and stopped (its binaries and the workers' imports read from disk once: the first start took twice as
    long as the next ones here)."""
    from drive.loop.collect import collect
    from drive.observe.demonstrations import recorder_for

    out = {}
    with console.status("warming up: recording the training dataset in this process ..."):
        started = time.perf_counter()
        collect(_options(cfg, data, 1, False, cfg.train_episodes, cfg.max_episode_steps), recorder_for)
        out["local_s"] = time.perf_counter() - started
    if "ray" not in cfg.skip and "collect" not in cfg.skip:
        with console.status("warming up: a Ray instance ..."):
            started = time.perf_counter()
            try:
                start_ray(cfg, -1)
            finally:
                stop_ray()
            out["ray_s"] = time.perf_counter() - started
    console.print("warm-up (untimed): " + ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in out.items()))
    return out


def measure_collection(cfg: ScaleOptions, console: Any) -> tuple[list[CollectRun], list[CollectRun]]:
    """The timed runs, and the Ray instance's start-up in each round (`start_ray`, before the round's Ray variants,
    which the plan keeps together: the instance is up only while they run)."""
    variants = [k for k in COLLECTION if not ("ray" in cfg.skip and COLLECTION[k][1])]
    runs, ray_starts = [], []
    try:
        for r, order in enumerate(round_orders(variants, cfg.repeats)):
            up = False
            for key in order:
                workers, on_ray = COLLECTION[key]
                if on_ray != up:  # entering or leaving the round's Ray variants (the plan keeps them together)
                    if on_ray:
                        with console.status(f"round {r + 1}/{cfg.repeats}, starting Ray ..."):
                            ray_starts.append(start_ray(cfg, r))
                        console.print(
                            f"round {r + 1}/{cfg.repeats}: Ray up in {ray_starts[-1].startup_s:.1f} s "
                            "(ray.init, 2 workers' imports, env, expert)"
                        )
                    else:
                        stop_ray()  # the pool runs without Ray's processes beside it
                    up = on_ray
                with console.status(f"round {r + 1}/{cfg.repeats}, collecting: {key} ..."):
                    run = collect_run(cfg, key, r, workers, on_ray, cfg.episodes)
                runs.append(run)
                console.print(
                    f"round {r + 1}/{cfg.repeats} {key}: {run.frames_per_s:.0f} frames/s ({run.frames} in "
                    f"{run.work_s:.1f} s on {run.cores:.2f} cores), start-up {run.startup_s:.2f} s = "
                    f"{100 * run.startup_share:.1f} %, load {run.load_before:.1f}"
                )
            stop_ray()
    finally:
        stop_ray()
    return runs, ray_starts


@dataclass(frozen=True)
class TrainRun:
    variant: str
    round: int
    ranks: int
    threads: int
    samples: int  # the training split: what one epoch passes over
    epoch_s: float  # the last epoch (training and rank 0's validation)
    load_before: float
    load_after: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.epoch_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "samples_per_s": self.samples_per_s}


def _train_command(cfg: ScaleOptions, data: Path, out: Path, threads: int, ranks: int) -> list[str]:
    launcher = (
        [sys.executable, "-m", "drive"]
        if ranks == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m", "drive"]
    )
    return [
        *launcher,
        "train",
        "--controller",
        cfg.controller,
        "--data",
        str(data),
        "--out",
        str(out),
        "--epochs",
        str(cfg.epochs),
        "--batch-size",
        str(cfg.batch_size),
        "--threads",
        str(threads),
        "--no-progress",
        "--set",
        "trainer.val_samples=2",
        "trainer.tensorboard=false",
        "trainer.patience=0",
    ]


def train_run(cfg: ScaleOptions, data: Path, variant: str, round_: int, n_train: int) -> TrainRun:
    threads, ranks = TRAINING[variant]
    with tempfile.TemporaryDirectory(prefix="bench_scale_train_") as tmp:
        out = Path(tmp) / "run"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        load = _load()
        done = subprocess.run(_train_command(cfg, data, out, threads, ranks), env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"training run ({ranks} rank(s), {threads} thread(s)) failed: {done.stderr[-800:]}")
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return TrainRun(variant, round_, ranks, threads, n_train, float(rows[-1]["seconds"]), load, _load())


def measure_training(cfg: ScaleOptions, data: Path, console: Any) -> list[TrainRun]:
    from drive.learn import tasks

    n_train = len(tasks.load("demos", tasks.options("demos", {}), data, 0).train)
    runs = []
    for r, order in enumerate(round_orders(list(TRAINING), cfg.repeats)):
        for key in order:
            with console.status(f"round {r + 1}/{cfg.repeats}, training: {key} ..."):
                run = train_run(cfg, data, key, r, n_train)
            runs.append(run)
            console.print(
                f"round {r + 1}/{cfg.repeats} {key}: {run.samples_per_s:.0f} samples/s (epoch "
                f"{run.epoch_s:.1f} s, {n_train} samples), load {run.load_before:.1f}"
            )
    return runs


def collection_figures(
    runs: Sequence[CollectRun], ray_starts: Sequence[CollectRun]
) -> tuple[dict[str, dict[str, Spread]], dict[str, Spread]]:
    """Per measure (frames/s over the work, whole-run frames/s, frames per CPU-second, cores, start-up s and share,
    work s, wall s) each variant's spread over rounds, the Ray instance's start-up among them; and the collection
    ratios, on frames/s, on whole-run frames/s (`*_wall`) and on frames per CPU-second (`*_per_cpu`)."""
    if not runs:
        return {}, {}
    figures: dict[str, dict[str, Spread]] = {}
    figures["frames_per_s"], ratios = summarise(by_round(runs, "frames_per_s"), COLLECTION_RATIOS)
    figures["wall_frames_per_s"], wall = summarise(by_round(runs, "wall_frames_per_s"), WALL_RATIOS)
    figures["frames_per_cpu_s"], per_cpu = summarise(by_round(runs, "frames_per_cpu_s"), PER_CPU_RATIOS)
    figures["cores"] = summarise(by_round(runs, "cores"), {})[0]
    for value in ("startup_s", "startup_share", "work_s", "wall_s"):
        figures[value] = summarise(by_round([*runs, *ray_starts], value), {})[0]
    return figures, {**ratios, **wall, **per_cpu}
