"""The `drive bench scale` study (this module: its options and what it compares; rounds.py: the order and the
statistics; runs.py: the timed runs): collection frames/s on 1 and 2 Ray workers beside the local process pool, and
training samples/s on 1 and 2 DDP ranks (one thread each, the same global batch) beside one process using two threads,
measured in one run and printed with the ratios the scaling issue targets:

    collection: 2 Ray workers >= 1.6x one Ray worker          training: 2 DDP ranks >= 1.5x one rank

Method. First an untimed warm-up (`warm_up`): `drive collect` in this process records the training dataset
(`--train-episodes`: imports, page cache, numba's kernels, the env and expert built), then a Ray instance is started
and stopped (the first start reads Ray's binaries from disk: 12-13 s here, 6-9 s after), so the first variant timed
is not the cold one. Then `--repeats` rounds, each timing every collection variant (pool1, pool2, ray1, ray2:
`drive collect` on the same track seeds, shards written, through run_tasks' two engines) and then every training
variant, in the round's order: as listed in even rounds, reversed in odd ones (`round_orders`, ABBA), so each
ratio's sides swap places from round to round and a drift of the machine falls on both alike. A variant's figure is
the median over rounds, its min-max beside it; a ratio is taken within each round, its two sides measured a minute
apart, and reported as the median and range of those per-round ratios (`summarise`).

Start-up is reported apart from throughput. Each episode's recorder notes the wall time and its process's CPU time
at its first and last step (`TimedRecorder`), so a run splits into start-up (the call to the run's first env step)
and work (first to last step): frames/s is frames over the work; the start-up, its share of the run and the
whole-run frames/s are printed beside it, the 2-over-1 ratios on both (`*_wall`). The pool forks its workers from
this process, whose env and expert the warm-up built, as Ray's workers keep theirs between tasks: each round starts
one local Ray instance for its two Ray variants (the plan keeps them together) and warms its two workers with an
episode each (`start_ray`). That start-up, ray.init plus the workers' imports, env and expert (6-9 s here), is
Ray's own, paid once per `drive collect --ray local` command or per cluster, not per run: it is timed in each round
and printed as its own row ("Ray instance"). Timed inside short runs, start-up and a cold first variant were what
the issue's 0.72x measured; a run's own start-up is now 0.02-0.16 s, under 1 % of it.

A shared machine. The workers' CPU time over the work (`cores`) is what the run was given: ~1 for a 1-worker run,
~2 for a 2-worker run on an idle machine. Where the 2-worker runs got less than 1.8, a note says the wall ratios
measure the neighbours too (`shared_note`); frames per CPU-second, and its 2-over-1 ratio (`*_per_cpu`: 1.0 when a
second worker costs nothing extra per frame), are each engine's own cost whoever else runs. The 1-minute load
average is recorded beside every run. Training runs `drive train` in subprocesses (torchrun for the ranks) on the
warm-up's dataset, whose size `--train-episodes` fixes whatever `--episodes`; samples/s is the training split's size
over the last epoch's time (metrics.jsonl "seconds": training plus rank 0's validation, made small here with two
validation samples per frame), so a process's start-up and first epoch are not counted.

Cost, on this 2-core machine (CarRacing, PPO expert, ~760 frames an episode, ~1,100 frames/s on one worker): the
default 40 episodes are ~30,000 frames a run, 15-40 s of work; a default run (3 rounds) took 8.6 and 9.4 minutes
beside other jobs (the 2-worker runs given ~1.3-1.5 cores), three quarters of it collection. A benchmark, not a test.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from drive.options import NonNegativeInt, PositiveInt

TARGETS = {"ray2_over_ray1": 1.6, "ddp2_over_ddp1": 1.5}
# workers, on Ray; the plan keeps the Ray variants together: a round starts one Ray instance for them
COLLECTION = {"pool1": (1, False), "pool2": (2, False), "ray1": (1, True), "ray2": (2, True)}
RAY_START = "ray_start"  # the run that starts a round's Ray instance (`start_ray`)
TRAINING = {"ddp1": (1, 1), "ddp2": (1, 2), "threads2": (2, 1)}  # torch threads per process, ranks
COLLECTION_RATIOS = {"ray2_over_ray1": ("ray2", "ray1"), "pool2_over_pool1": ("pool2", "pool1"),
                     "ray1_over_pool1": ("ray1", "pool1"), "ray2_over_pool2": ("ray2", "pool2")}  # fmt: skip
WALL_RATIOS = {"ray2_over_ray1_wall": ("ray2", "ray1"), "pool2_over_pool1_wall": ("pool2", "pool1")}
# frames per CPU-second, 2 workers over 1: the parallel efficiency (1.0: a second worker costs nothing extra per frame)
PER_CPU_RATIOS = {"ray2_over_ray1_per_cpu": ("ray2", "ray1"), "pool2_over_pool1_per_cpu": ("pool2", "pool1")}
TRAINING_RATIOS = {"ddp2_over_ddp1": ("ddp2", "ddp1"), "threads2_over_ddp1": ("threads2", "ddp1"),
                   "ddp2_over_threads2": ("ddp2", "threads2")}  # fmt: skip
SKIPPABLE = ("collect", "ray", "train")
FULL_SHARE = 0.9  # a 2-worker run's workers given under 90 % of two cores were sharing them with other processes


@dataclass(frozen=True)
class ScaleOptions:
    """What `drive bench scale` measures (its command's options)."""

    out: Path | None = None
    """results JSON file; default: print only"""
    episodes: PositiveInt = 40
    """episodes per collection run (even, so two workers share them equally): 15-40 s of work here"""
    repeats: PositiveInt = 3
    """rounds: every variant is timed once per round, the order reversed every other round; figures are medians"""
    first_seed: NonNegativeInt = 6000
    """track seeds of the collection runs: first_seed .. first_seed + episodes - 1"""
    expert: str = "ppo"
    """expert that drives the collection runs"""
    env: str = "carracing"
    """simulator: carracing, or fake-road (a quick check of the benchmark itself)"""
    max_episode_steps: PositiveInt = 1000
    """step limit per episode"""
    train_episodes: PositiveInt = 4
    """episodes the warm-up records for the training runs (at least 3: train, validation and test splits)"""
    controller: str = "nsac"
    """controller the training runs train (on the recorded frames)"""
    batch_size: PositiveInt = 64
    """global minibatch of every training run"""
    epochs: PositiveInt = 2
    """epochs per training run; the last one is timed (the first warms allocator and caches)"""
    skip: tuple[str, ...] = ()
    """parts to leave out: collect, ray (the Ray variants: Ray not installed), train"""
