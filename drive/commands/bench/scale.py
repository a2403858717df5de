"""`drive bench scale`: collection frames/s on 1 and 2 Ray workers beside the local process pool, and training
samples/s on 1 and 2 DDP ranks (one thread each, the same global batch) beside one process using two threads,
measured in one run and printed with the ratios the scaling issue targets:

    collection: 2 Ray workers >= 1.6x one Ray worker          training: 2 DDP ranks >= 1.5x one rank

Collection runs `drive collect` (the expert in the pixel env, shards written) on the same track seeds each time,
through run_tasks' two engines; the Ray instance is started before the clock starts (a cluster is up before a job
is submitted), so a Ray figure counts worker start-up and the episodes, as the pool's figure does. Training runs
`drive train` in subprocesses (torchrun for the ranks) on the dataset the collection recorded; samples/s is the
training split's size over the last epoch's time (metrics.jsonl "seconds": training plus rank 0's validation, made
small here with two validation samples per frame). A benchmark, not a test: on a shared machine the ratios
mostly measure the neighbours, so the 1-minute load average is recorded beside every figure and the machine's cores
with it. Ray workers are warmed (started, the collector's modules imported) before the clock starts; the pool's
figures include its start-up.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from datasets.files import atomic_write
from drive.errors import UserError
from drive.loop.options import CollectOptions
from drive.options import NonNegativeInt, PositiveInt

TARGETS = {"ray2_over_ray1": 1.6, "ddp2_over_ddp1": 1.5}


@dataclass(frozen=True)
class Config:
    out: Path | None = None
    """results JSON file; default: print only"""
    episodes: PositiveInt = 8
    """episodes per collection run (even, so two workers share them equally)"""
    first_seed: NonNegativeInt = 6000
    """track seeds of the collection runs: first_seed .. first_seed + episodes - 1"""
    expert: str = "ppo"
    """expert that drives the collection runs"""
    env: str = "carracing"
    """simulator: carracing, or fake-road (a quick check of the benchmark itself)"""
    max_episode_steps: PositiveInt = 1000
    """step limit per episode"""
    controller: str = "nsac"
    """controller the training runs train (on the recorded frames)"""
    batch_size: PositiveInt = 64
    """global minibatch of every training run"""
    epochs: PositiveInt = 2
    """epochs per training run; the last one is timed (the first warms allocator and caches)"""
    skip: tuple[str, ...] = ()
    """parts to leave out: collect, train"""


def _load() -> float:
    return os.getloadavg()[0]


def _collect(cfg: Config, out: Path, workers: int, ray: bool) -> dict:
    from drive.loop.collect import collect  # torch and the simulator: not for `--help`
    from drive.observe.demonstrations import recorder_for

    seeds = f"{cfg.first_seed}-{cfg.first_seed + cfg.episodes - 1}"
    opts = CollectOptions(out=out, expert=cfg.expert, env=cfg.env, seeds=seeds, workers=workers,
                          max_episode_steps=cfg.max_episode_steps, min_return=-1e9, progress=False,
                          ray="local" if ray else None)  # fmt: skip
    load = _load()
    if ray:
        import ray as ray_module

        ray_module.init(num_cpus=workers, include_dashboard=False, object_store_memory=128 * 2**20,
                        log_to_driver=False, logging_level=logging.ERROR)  # fmt: skip
        _warm(ray_module, workers)
    try:
        summary = collect(opts, recorder_for)
    finally:
        if ray:
            ray_module.shutdown()
    return {"frames": summary.frames, "seconds": summary.seconds, "frames_per_s": summary.fps,
            "load_before": load, "load_after": _load()}  # fmt: skip


def _warm(ray, workers: int) -> None:
    """Every worker process started and the collector's imports (torch, the env, the expert's code) loaded: the
    figure is then the episodes' throughput, as on a cluster whose workers already run."""

    @ray.remote(num_cpus=1)
    def load() -> int:
        import drive.loop.collect  # noqa: F401

        time.sleep(0.5)  # hold the CPU so the next warm-up task lands on another worker
        return os.getpid()

    pids = set(ray.get([load.remote() for _ in range(workers)]))
    if len(pids) != workers:
        raise RuntimeError(f"Ray warm-up reached {len(pids)} worker(s), expected {workers}")


def measure_collection(cfg: Config, data: Path, console) -> dict[str, dict]:
    import torch

    torch.set_num_threads(1)  # the 1-worker pool runs here: one thread, as the pool's and Ray's workers have
    plan = [("pool2", 2, False), ("pool1", 1, False), ("ray1", 1, True), ("ray2", 2, True)]
    results = {}
    for key, workers, ray in plan:
        with tempfile.TemporaryDirectory(prefix="bench_scale_") as tmp:
            out = data if key == "ray2" else Path(tmp) / "data"  # the last run's dataset is what training reads
            with console.status(f"collecting: {key} ..."):
                results[key] = _collect(cfg, out, workers, ray)
        r = results[key]
        console.print(f"collect {key}: {r['frames_per_s']:.0f} frames/s ({r['frames']} frames, "
                      f"load {r['load_before']:.1f})")  # fmt: skip
    return results


def _train_command(cfg: Config, data: Path, out: Path, threads: int, ranks: int) -> list[str]:
    launcher = (
        [sys.executable, "-m", "drive"]
        if ranks == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m", "drive"]
    )
    return [*launcher, "train", "--controller", cfg.controller, "--data", str(data), "--out", str(out),
            "--epochs", str(cfg.epochs), "--batch-size", str(cfg.batch_size), "--threads", str(threads),
            "--no-progress", "--set", "trainer.val_samples=2", "trainer.tensorboard=false",
            "trainer.patience=0"]  # fmt: skip


def _train(cfg: Config, data: Path, threads: int, ranks: int, n_train: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_scale_train_") as tmp:
        out = Path(tmp) / "run"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        load = _load()
        done = subprocess.run(_train_command(cfg, data, out, threads, ranks), env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"training run ({ranks} rank(s), {threads} thread(s)) failed: {done.stderr[-800:]}")
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    seconds = float(rows[-1]["seconds"])
    return {"ranks": ranks, "threads": threads, "epoch_seconds": seconds, "samples_per_s": n_train / seconds,
            "load_before": load, "load_after": _load()}  # fmt: skip


def measure_training(cfg: Config, data: Path, console) -> dict[str, dict]:
    from drive.learn import tasks

    n_train = len(tasks.load("demos", tasks.options("demos", {}), data, 0).train)
    plan = [("ddp1", 1, 1), ("ddp2", 1, 2), ("threads2", 2, 1)]
    results = {}
    for key, threads, ranks in plan:
        with console.status(f"training: {key} ..."):
            results[key] = _train(cfg, data, threads, ranks, n_train)
        r = results[key]
        console.print(f"train {key}: {r['samples_per_s']:.0f} samples/s (epoch {r['epoch_seconds']:.1f} s, "
                      f"{n_train} samples, load {r['load_before']:.1f})")  # fmt: skip
    return results


def ratios_of(collection: dict, training: dict) -> dict[str, float]:
    out = {}
    if collection:
        fps = {k: v["frames_per_s"] for k, v in collection.items()}
        out.update(ray2_over_ray1=fps["ray2"] / fps["ray1"], pool2_over_pool1=fps["pool2"] / fps["pool1"],
                   ray1_over_pool1=fps["ray1"] / fps["pool1"], ray2_over_pool2=fps["ray2"] / fps["pool2"])  # fmt: skip
    if training:
        sps = {k: v["samples_per_s"] for k, v in training.items()}
        out.update(ddp2_over_ddp1=sps["ddp2"] / sps["ddp1"], threads2_over_ddp1=sps["threads2"] / sps["ddp1"],
                   ddp2_over_threads2=sps["ddp2"] / sps["threads2"])  # fmt: skip
    return out


def print_ratios(console, ratios: dict[str, float]) -> None:
    from rich.table import Table

    table = Table(title="ratios")
    for col in ("ratio", "measured", "target", ""):
        table.add_column(col, justify="left" if col == "ratio" else "right")
    for key, value in ratios.items():
        target = TARGETS.get(key)
        verdict = "" if target is None else ("met" if value >= target else "MISSED")
        table.add_row(key, f"{value:.2f}x", f">= {target}x" if target else "", verdict)
    console.print(table)


def run(cfg: Config) -> int:
    from rich.console import Console

    if cfg.episodes < 2 or cfg.episodes % 2:
        raise UserError(f"--episodes must be even and >= 2, got {cfg.episodes}")
    unknown = set(cfg.skip) - {"collect", "train"}
    if unknown:
        raise UserError(f"--skip {sorted(unknown)}: choose from collect, train")
    console = Console()
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="bench_scale_data_"))
    try:
        data = work / "demos"
        collection = measure_collection(cfg, data, console) if "collect" not in cfg.skip else {}
        if "train" not in cfg.skip and not collection:
            _collect(cfg, data, 2, False)  # training needs recorded frames even when collection is not timed
        training = measure_training(cfg, data, console) if "train" not in cfg.skip else {}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = ratios_of(collection, training)
    print_ratios(console, ratios)
    results = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()},
               "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                           "python": platform.python_version()},
               "collection": collection, "training": training, "ratios": ratios, "targets": TARGETS,
               "wall_s": time.time() - started}  # fmt: skip
    if cfg.out is not None:
        atomic_write(Path(cfg.out), (json.dumps(results, indent=1) + "\n").encode())
        console.print(f"wrote {cfg.out}")
    return 0
