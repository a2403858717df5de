"""The loop rows: `drive collect` on 1 and 2 workers and `drive eval` of a trained controller with K cars per process,
each a whole run of the command's own function (pool start-up, policy building, shards written), timed in CPU and
wall seconds. What they are divided by, our bare env on random actions and on the expert's laps (`bare_env`), is
measured again beside each 1-worker row: in each collect round, in the same alternation, and just before and after
each eval run (`detail["beside"]`).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol

from drive.loop.options import CollectOptions, EvalOptions
from drive.studies.closedloop.envs import Bare, EnvRowsConfig, Row, bare_env, timed


class LoopRowsConfig(Protocol):
    """What these rows read of `drive bench closedloop`'s Config (a dataclass: `warm_up_loops` replaces fields)."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]  # a dataclass, for `dataclasses.replace`

    @property
    def rounds(self) -> int: ...

    @property
    def episodes(self) -> int: ...

    @property
    def max_episode_steps(self) -> int: ...

    @property
    def expert(self) -> str: ...

    @property
    def policy(self) -> str: ...

    @property
    def samples(self) -> int: ...

    @property
    def collect_envs(self) -> tuple[int, ...]: ...

    @property
    def eval_episodes(self) -> int: ...

    @property
    def eval_max_episode_steps(self) -> int: ...

    @property
    def first_seed(self) -> int: ...

    @property
    def envs(self) -> tuple[int, ...]: ...


def collect_run(cfg: LoopRowsConfig, workers: int, envs: int = 0) -> tuple[int, float, float]:
    """Steps, wall and CPU seconds of one `drive collect --envs ENVS` run (0: drive/loop/lanes.py AUTO_COLLECT_ENVS)."""
    from drive.loop.collect import collect
    from drive.observe.demonstrations import recorder_for

    with tempfile.TemporaryDirectory(prefix="bench_closedloop_") as tmp:
        options = CollectOptions(
            out=Path(tmp),
            expert=cfg.expert,
            episodes=cfg.episodes,
            envs=envs,
            seeds=f"{cfg.first_seed}-{cfg.first_seed + cfg.episodes - 1}",
            workers=workers,
            max_episode_steps=cfg.max_episode_steps,
            progress=False,
        )
        return timed(lambda: collect(options, recorder_for).frames)


def collect_rows(cfg: LoopRowsConfig, bare: Bare | None = None) -> dict[str, Row]:
    """The 1-worker collect runs, `--envs 0` (collect1) and each K of `collect_envs` (collect1_kK), in `--rounds`
    rounds of alternating order, summed, each round's rate kept: a run is a few CPU-seconds, which one disturbance
    of a shared machine would decide alone. With `bare`, our env is measured in each round too, in the same
    alternation (`beside`: what the rows' ratios divide by)."""
    plan = {"collect1": 0, **{f"collect1_k{k}": k for k in cfg.collect_envs}}
    runs: dict[str, list[tuple[int, float, float]]] = {key: [] for key in plan}
    besides: list[dict[str, tuple[int, float, float]]] = []
    for r in range(cfg.rounds):
        for key in [*plan, *(["bare"] if bare else [])][:: 1 if r % 2 == 0 else -1]:
            if key == "bare" and bare is not None:
                besides.append(bare())
            else:
                runs[key].append(collect_run(cfg, 1, plan[key]))
    return {
        key: Row(
            f"collect {cfg.expert}, 1 worker" + (f", {plan[key]} cars" if plan[key] else ""),
            sum(n for n, _, _ in done),
            sum(w for _, w, _ in done),
            sum(c for _, _, c in done),
            detail={
                "episodes": cfg.episodes,
                "workers": 1,
                "envs": plan[key],
                "per_round_steps_per_cpu_s": [n / c for n, _, c in done],
                **beside(besides),
            },
        )
        for key, done in runs.items()
    }


def beside(besides: list[dict[str, tuple[int, float, float]]]) -> dict[str, dict[str, list[list[float]]]]:
    """A loop row's `detail["beside"]`: per env row (renderer, renderer_driving), [steps, CPU s] of each measurement
    of our env taken beside the row (one per round; an eval row's before and after it); {} without any."""
    if not besides:
        return {}
    return {"beside": {key: [[float(m[key][0]), m[key][2]] for m in besides] for key in besides[0]}}


def collect2_row(cfg: LoopRowsConfig) -> Row:
    steps, wall, cpu = collect_run(cfg, 2)
    return Row(f"collect {cfg.expert}, 2 workers", steps, wall, cpu, detail={"episodes": cfg.episodes, "workers": 2})


def warm_up_loops(cfg: LoopRowsConfig) -> float:
    """CPU seconds of a 3-step collect and eval in this process: the imports, checkpoints and first calls a process
    pays once, which would otherwise land in the first timed collect and eval rows."""
    tiny = dataclasses.replace(cfg, episodes=1, max_episode_steps=3, eval_episodes=1, eval_max_episode_steps=3)
    return collect_run(tiny, 1)[2] + eval_row(tiny, 1, 1).cpu_s


def eval_row(cfg: LoopRowsConfig, k: int, workers: int, bare: Bare | None = None) -> Row:
    """One `drive eval --envs K` run on `workers` workers; with `bare`, our env measured just before and just after it
    (`beside`)."""
    from drive.loop.evaluate import evaluate

    label = f"eval S={cfg.samples}, K={k} cars, {workers} worker{'s' * (workers > 1)}"
    n = cfg.eval_episodes * workers
    options = EvalOptions(
        policy=cfg.policy,
        seeds=f"{cfg.first_seed}-{cfg.first_seed + n - 1}",
        workers=workers,
        samples=cfg.samples,
        max_episode_steps=cfg.eval_max_episode_steps,
        progress=False,
        envs=k,
        failure_horizon=0,
    )
    before = [bare()] if bare else []
    steps, wall, cpu = timed(lambda: sum(int(r["steps"]) for r in evaluate(options)["episodes"]))
    after = [bare()] if bare else []
    return Row(label, steps, wall, cpu, detail={"episodes": n, "envs": k, "workers": workers, **beside(before + after)})


class RowsConfig(EnvRowsConfig, LoopRowsConfig, Protocol):
    """`drive bench closedloop`'s Config, as the loop rows with our env beside them read it."""


def best_eval(rows: dict[str, Row], ks: tuple[int, ...]) -> int | None:
    """The K of the 1-worker eval row with the most steps per CPU-second (None: no eval row measured)."""
    rated = [(rows[f"eval_k{k}"].steps_per_cpu_s if f"eval_k{k}" in rows else None, k) for k in ks]
    return max(((r, k) for r, k in rated if r is not None), default=(None, None))[1]


def measure_loops(cfg: RowsConfig, console: Any) -> dict[str, Row]:
    """The collect and eval rows, each 1-worker row with our env measured beside it (`bare_env`), then eval's best K
    on 2 workers."""
    rows: dict[str, Row] = {}
    bare = bare_env(cfg)  # our env again beside each 1-worker loop row: what its ratios divide by
    # each ratio's two rows run back to back: on a shared machine even CPU time per step drifts (2x in minutes, seen)
    plan: list[tuple[str, Callable[[], dict[str, Row]]]] = [
        ("collect1", lambda: collect_rows(cfg, bare)),
        ("collect2", lambda: {"collect2": collect2_row(cfg)}),
        *[(f"eval_k{k}", lambda k=k: {f"eval_k{k}": eval_row(cfg, k, 1, bare)}) for k in cfg.envs],
    ]
    for key, measure in plan:
        with console.status(f"measuring {key} ..."):
            measured = measure()
        rows.update(measured)
        for row in measured.values():
            console.print(
                f"{row.label}: "
                + (row.skipped or f"{row.steps_per_cpu_s:.0f} steps per CPU-s, {row.steps_per_s:.0f} steps/s")
            )
    best = best_eval(rows, cfg.envs)
    if best is None:
        rows["eval2"] = Row("eval, best K, 2 workers", skipped="not available: no eval row was measured")
    else:
        with console.status("measuring eval2 ..."):
            rows["eval2"] = eval_row(cfg, best, 2)
    return rows
