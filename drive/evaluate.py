"""`drive eval`: closed-loop evaluation of a policy on track seeds, one episode per seed, optionally in parallel.

The policy is named by a spec `KIND:ARG`; `POLICY_KINDS` maps each kind to a builder `(arg, env) -> policy`, so a
new kind (trained controllers: `ckpt:PATH`) is one function and one line there. Policies that never look at pixels
(experts act from the privileged state) run the env in its state-only mode, which has the same physics and reward
but draws no frames.

Output JSON: settings, one record per episode (seed, return, completion, steps, tiles, off_track_events,
lap_finished, ..., plus whatever the policy's `episode_summary()` adds) and mean_return, std_return, min_return,
max_return, mean_completion, laps_finished.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from datasets.demonstrations import atomic_write
from drive.pool import Ticker, run_tasks
from drive.rollout import Policy, load_expert_policy, make_env, parse_seeds, rollout

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    policy: str = "expert:ppo"
    """policy spec: expert:ppo, expert:pursuit, expert:PATH (expert checkpoint), ckpt:PATH (trained controller)"""
    seeds: str = "1000-1019"
    """track seeds: 'A-B' (inclusive), 'A,B,C' or a mix"""
    out: Path | None = None
    """results JSON file (per-episode records and summary); default: print only"""
    workers: int = 1
    """parallel worker processes, one episode per task"""
    max_episode_steps: int = 1000
    """step limit per episode (CarRacing-v3's is 1000)"""
    env: Literal["carracing", "fake-road"] = "carracing"
    """simulator: carracing, or fake-road (a tiny synthetic road for tests; its expert is 'pursuit')"""
    progress: bool = True
    """show a progress bar"""
    # -- trained controllers (ckpt:PATH); see drive/policies.py --
    samples: int | None = None
    """ckpt: stochastic samples per step (default: the controller's own, 32 for NSAC)"""
    shadow: str | None = None
    """ckpt: shadow expert on the controller's states (default: the expert that labelled its data; none: off)"""
    fallback: Literal["off", "expert", "slow"] = "off"
    """ckpt: uncertainty-gated fallback; when on, every seed also runs without it and both returns are reported"""
    fallback_threshold: float | None = None
    """ckpt: epistemic-variance threshold (default: stored in the checkpoint, else calibrated on --calibrate-seeds)"""
    calibrate_seeds: str = "2000-2004"
    """ckpt: nominal laps to calibrate the fallback threshold on, when none is given or stored"""
    trace: Path | None = None
    """ckpt: write each episode's interpretability trace (Parquet + plots) into this directory"""
    seed: int = 0
    """ckpt: seed of the controller's sampling"""


# -- policy specs ----------------------------------------------------------------------------------------------------
def _expert(arg: str, env: str) -> Policy:
    return load_expert_policy(arg, env)


def _ckpt(arg: str, env: str, **options: Any) -> Policy:
    from drive.policies import ckpt_policy

    return ckpt_policy(arg, env, **options)


#: spec kind -> builder(arg, env, **options). Extend here.
POLICY_KINDS: dict[str, Callable[..., Policy]] = {"expert": _expert, "ckpt": _ckpt}


def parse_policy_spec(spec: str) -> tuple[str, str]:
    """'expert:ppo' -> ('expert', 'ppo'); a clear error for anything else."""
    kind, sep, arg = str(spec).partition(":")
    if not sep or not arg or kind not in POLICY_KINDS:
        kinds = ", ".join(f"{k}:..." for k in POLICY_KINDS)
        raise ValueError(f"policy spec {spec!r}: expected KIND:ARG with KIND one of ({kinds}), e.g. expert:ppo")
    return kind, arg


def make_policy(spec: str, env: str = "carracing", **options: Any) -> Policy:
    """Build the policy a spec such as 'expert:ppo' names (options: only for kinds that take them, e.g. ckpt)."""
    kind, arg = parse_policy_spec(spec)
    return POLICY_KINDS[kind](arg, env, **options)


# -- one episode (in a worker or in this process) --------------------------------------------------------------------
_CACHE: dict[tuple, tuple] = {}


def evaluate_episode(spec: str, env_settings: Mapping[str, Any], seed: int, tick=None) -> dict[str, Any]:
    key = (spec, tuple(sorted(env_settings.items())))
    if key not in _CACHE:
        _CACHE.clear()
        policy = make_policy(spec, env_settings["env"], **dict(env_settings.get("policy_options", ())))
        pixels = bool(getattr(policy, "needs_pixels", True))
        trace = env_settings.get("trace")
        env = make_env(env_settings["env"], pixels=pixels, max_episode_steps=env_settings["max_episode_steps"],
                       keep_raw=bool(trace) or getattr(policy, "needs_raw", False))  # fmt: skip
        observers = []
        if trace:
            from drive.recorder import TraceRecorder

            observers.append(TraceRecorder(trace, env=env, policy_name=spec))
        _CACHE[key] = (policy, env, observers)
    policy, env, observers = _CACHE[key]
    start = time.perf_counter()
    [result] = rollout(env, policy, seeds=[seed], on_step=[Ticker(tick), *observers])
    record = result.to_dict()
    record["wall_s"] = time.perf_counter() - start
    return record


def summarise(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Across episodes: return mean/std (population)/min/max, mean completion, laps finished."""
    returns = np.array([r["return"] for r in records], dtype=np.float64)
    return {
        "n_episodes": len(records),
        "mean_return": float(returns.mean()),
        "std_return": float(returns.std()),
        "min_return": float(returns.min()),
        "max_return": float(returns.max()),
        "mean_completion": float(np.mean([r["completion"] for r in records])),
        "laps_finished": int(sum(bool(r["lap_finished"]) for r in records)),
        "off_track_events": int(sum(int(r["off_track_events"]) for r in records)),
    }


def evaluate_controller(cfg: Any, seeds: Sequence[int], env_settings: dict[str, Any]) -> dict[str, Any]:
    """`drive eval` for a trained controller: the episodes (in parallel with --workers) with shadow-expert
    calibration, latency and traces; with a fallback, every seed runs twice — with the fallback and without — and
    both returns are reported (mean_return is the run with the fallback)."""
    from drive.fallback import fallback_for_command
    from drive.policies import aggregate, default_shadow

    _, path = parse_policy_spec(cfg.policy)
    shadow = default_shadow(cfg.shadow, cfg.env, path)
    options = {"samples": cfg.samples, "shadow": shadow or "none", "seed": cfg.seed}
    out: dict[str, Any] = {"policy": cfg.policy, "env": cfg.env, "seeds": list(seeds),
                           "max_episode_steps": cfg.max_episode_steps, "shadow": shadow}  # fmt: skip
    variants = [("", {**options, "fallback": "off"})]
    fb, threshold, origin = fallback_for_command(cfg, path)
    if fb is not None:
        out["fallback"] = {"mode": fb.mode, "signal": fb.signal, "quantile": fb.quantile, "threshold": threshold,
                           "threshold_origin": origin}  # fmt: skip
        variants = [("", {**options, "fallback": fb.mode, "fallback_threshold": threshold}),
                    ("no_fallback", variants[0][1])]  # fmt: skip
    start = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {}
    for name, opts in variants:
        settings = {**env_settings, "policy_options": tuple(sorted(opts.items()))}
        if cfg.trace is not None and not name:  # the comparison run without fallback is not traced
            settings["trace"] = str(cfg.trace)
        records: list[dict[str, Any]] = []
        tasks = [(cfg.policy, settings, seed) for seed in seeds]
        run_tasks(evaluate_episode, tasks, cfg.workers, records.append, show=cfg.progress, label=name or "eval")
        runs[name] = sorted(records, key=lambda r: r["seed"])
    records = runs[""]
    out.update(summarise(records))
    out.update(aggregate(records))
    if "no_fallback" in runs:
        plain = runs["no_fallback"]
        for record, other in zip(records, plain, strict=True):
            record["return_no_fallback"] = other["return"]
        without = summarise(plain)
        out.update({f"{k}_no_fallback": without[k] for k in ("mean_return", "std_return", "min_return")})
        out["episodes_no_fallback"] = plain
    out["wall_s"] = time.perf_counter() - start
    out["episodes"] = records
    return out


def describe(results: Mapping[str, Any]) -> str:
    """The controller-specific lines `drive eval` prints under its table."""
    lines = []
    if "coverage90_steer" in results:
        r = results
        lines.append(f"shadow expert ({r.get('shadow')}): coverage50_steer {r['coverage50_steer']:.3f}, "
                     f"coverage90_steer {r['coverage90_steer']:.3f}, nll_expert {r['nll_expert']:.3f}")  # fmt: skip
    if "latency_ms_p50" in results:
        lines.append(f"controller latency per step: p50 {results['latency_ms_p50']:.2f} ms, "
                     f"p95 {results['latency_ms_p95']:.2f} ms")  # fmt: skip
    if "fallback" in results:
        fb = results["fallback"]
        lines.append(f"fallback {fb['mode']} (threshold {fb['threshold']:.3g}, {fb['threshold_origin']}): "
                     f"{results.get('n_interventions', 0)} interventions, {results.get('fallback_fraction', 0):.1%} "
                     f"of steps; mean_return {results['mean_return']:.1f} with, "
                     f"{results['mean_return_no_fallback']:.1f} without")  # fmt: skip
    return "\n".join(lines)


def evaluate(cfg: Config) -> dict[str, Any]:
    seeds = parse_seeds(cfg.seeds)
    if cfg.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {cfg.workers}")
    parse_policy_spec(cfg.policy)  # a bad spec fails here, not in every worker
    env_settings = {"env": cfg.env, "max_episode_steps": cfg.max_episode_steps}
    if parse_policy_spec(cfg.policy)[0] == "ckpt":
        return evaluate_controller(cfg, seeds, env_settings)
    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    tasks = [(cfg.policy, env_settings, seed) for seed in seeds]
    run_tasks(evaluate_episode, tasks, cfg.workers, records.append, show=cfg.progress, label="eval")
    records.sort(key=lambda r: r["seed"])
    return {
        "policy": cfg.policy,
        "env": cfg.env,
        "seeds": seeds,
        "max_episode_steps": cfg.max_episode_steps,
        **summarise(records),
        "wall_s": time.perf_counter() - start,
        "episodes": records,
    }


def run(cfg: Config) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        results = evaluate(cfg)
    except ValueError as exc:
        print(f"drive eval: error: {exc}", file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{cfg.policy} on {cfg.env}, seeds {cfg.seeds}")
    for col in ("seed", "return", "completion", "steps", "off-track", "lap"):
        table.add_column(col, justify="right")
    for r in results["episodes"]:
        table.add_row(
            str(r["seed"]),
            f"{r['return']:.1f}",
            f"{r['completion']:.3f}",
            str(r["steps"]),
            str(r["off_track_events"]),
            "yes" if r["lap_finished"] else "no",
        )
    Console().print(table)
    print(
        f"mean_return {results['mean_return']:.1f} +- {results['std_return']:.1f} (std), "
        f"min_return {results['min_return']:.1f}, max_return {results['max_return']:.1f}, "
        f"{results['laps_finished']}/{results['n_episodes']} laps finished"
    )
    if parse_policy_spec(cfg.policy)[0] == "ckpt":
        print(describe(results))
    if cfg.out is not None:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(Path(cfg.out), (json.dumps(results, indent=1) + "\n").encode())
        print(f"wrote {cfg.out}")
    return 0
