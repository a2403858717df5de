"""Closed-loop evaluation of a policy on track seeds, one episode per seed, in this process or a worker pool.

The policy is a `PolicySpec` (`expert:ppo`, `ckpt:PATH` and a controller's options; drive/loop/specs.py), which every
worker receives and builds. Policies that never look at pixels
(experts act from the privileged state) run the env in its state-only mode: same physics and reward, no frames.
A trained controller (`ckpt:PATH`) also gets its shadow expert (on-policy calibration), its latency and, with a
fallback, a second run of every seed without it so both returns are reported.

Observers such as the interpretability trace are built inside each worker by an `ObserverFactory` (the caller's:
the loop does not know observers), called with the worker's env and the policy's name (`str(spec)`).

Output: settings, one record per episode (seed, return, completion, steps, tiles, off_track_events, lap_finished,
... plus the policy's `episode_summary()`) and mean/std/min/max return, mean completion, laps finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np

from datasets.root import portable
from drive.devices import resolve
from drive.errors import UserError
from drive.loop.envs import make_env
from drive.loop.failures import FailureMonitor, failure_report, nominal_thresholds, split_traces
from drive.loop.fallback import FallbackConfig
from drive.loop.lanes import act_lanes, cached_lanes, cars_per_process, episodes_in
from drive.loop.options import EvalOptions
from drive.loop.policies import aggregate
from drive.loop.pool import Ticker, run_tasks
from drive.loop.rollout import EpisodeResult, Lane, Observer, run_lanes
from drive.loop.seeds import parse_seeds
from drive.loop.specs import PolicySpec, default_shadow
from drive.loop.thresholds import fallback_for_command
from drive.perturb.registry import parse_shift, shifted_env
from sim_bridges.carracing.bridge import IDX

ObserverFactory = Callable[[gym.Env, str], Observer]


_CACHE: dict[Any, list[Lane]] = {}  # per process: (spec, settings, observers) -> its lanes, built once per worker


def _lanes(spec: PolicySpec, settings: Mapping[str, Any], k: int, observers: ObserverFactory | None) -> list[Lane]:
    def lane(policy: Any) -> Lane:
        env = make_env(
            settings["env"],
            pixels=bool(getattr(policy, "needs_pixels", True)),
            max_episode_steps=settings["max_episode_steps"],
        )
        env = shifted_env(env, parse_shift(settings["perturb"]) if settings.get("perturb") else None)
        built = [observers(env, str(spec))] if observers is not None else []
        monitor = [FailureMonitor(IDX["heading_error"])] if settings.get("failures") else []
        return Lane(env, policy, [*built, *monitor])

    try:
        hash(observers)
        factory: Any = observers
    except TypeError:
        factory = id(observers)
    return cached_lanes(_CACHE, (spec, tuple(sorted(settings.items())), factory), k, spec.build, lane)


def evaluate_episodes(
    spec: PolicySpec,
    settings: Mapping[str, Any],
    seeds: Sequence[int],
    tick: Callable[[int], None] | None = None,
    observers: ObserverFactory | None = None,
) -> list[dict[str, Any]]:
    """One record per seed, in seed order, driven len(seeds) cars at once (one process, one controller call per
    step for all of them: drive/loop/rollout.py `run_lanes`)."""
    lanes = _lanes(spec, settings, len(seeds), observers)
    ticker = Ticker(tick)
    runs = [Lane(lane.env, lane.policy, [ticker, *lane.observers]) for lane in lanes]
    start = time.perf_counter()
    records: dict[int, dict[str, Any]] = {}

    def finished(j: int, result: EpisodeResult) -> None:  # per-step traces of the observers that keep them
        traces = {
            k: v for o in lanes[j].observers if hasattr(o, "episode_traces") for k, v in o.episode_traces().items()
        }
        records[result.seed] = {**result.to_dict(), **traces, "wall_s": time.perf_counter() - start}

    run_lanes(runs, list(seeds), act_lanes, finished)
    return [records[seed] for seed in seeds]


def summarise_returns(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Across episodes: return mean/std (population)/min/max, mean completion, laps finished, off-track events."""
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


def phase_label(phase: str, fallback: bool = False) -> str:
    """The progress bar's label of one phase of `evaluate`, each a bar over its own episodes: the seeds ("eval"; with
    a fallback "eval, fallback on" and then "eval, fallback off" on the same seeds), then for failure prediction the
    nominal laps on --calibrate-seeds that set the alarm thresholds. Short: an 80-column bar has ~22 characters left."""
    if phase == "nominal":
        return "alarm calibration laps"
    if phase == "no_fallback":
        return "eval, fallback off"
    return "eval, fallback on" if fallback else "eval"


def _episodes(
    opts: EvalOptions,
    spec: PolicySpec,
    seeds: Sequence[int],
    settings: Mapping[str, Any],
    label: str,
    observers: ObserverFactory | None,
) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    k = cars_per_process(opts.envs, len(seeds), opts.workers)
    tasks = [(spec, settings, tuple(seeds[i : i + k])) for i in range(0, len(seeds), k)]
    run_tasks(
        evaluate_episodes,
        tasks,
        opts.workers,
        records.extend,
        show=opts.progress,
        label=label,
        extra=(observers,) if observers is not None else (),
        ray=opts.ray,
        size=episodes_in,
    )
    return sorted(records, key=lambda r: r["seed"])


def _controller_variants(opts: EvalOptions, spec: PolicySpec) -> tuple[dict[str, Any], list[tuple[str, PolicySpec]]]:
    shadow = default_shadow(opts.shadow, opts.env, spec.arg)
    plain = replace(spec, samples=opts.samples, shadow=shadow or "none", seed=opts.seed, device=opts.device)
    header: dict[str, Any] = {"shadow": shadow}
    variants: list[tuple[str, PolicySpec]] = [("", plain)]
    fb, threshold, origin = fallback_for_command(opts, spec.arg)
    if fb is not None:
        header["fallback"] = {
            "mode": fb.mode,
            "signal": fb.signal,
            "quantile": fb.quantile,
            "threshold": threshold,
            "threshold_origin": origin,
        }
        gated = replace(plain, fallback=fb.mode, threshold=threshold)
        variants = [("", gated), ("no_fallback", plain)] if opts.fallback_twin else [("", gated)]
    return header, variants


def evaluate(opts: EvalOptions, observers: ObserverFactory | None = None) -> dict[str, Any]:
    """Every seed's episode and the summary. For `ckpt:` policies also shadow-expert calibration, latency, and with
    a fallback both returns (mean_return is the run with the fallback; the run without it is never observed)."""
    seeds = parse_seeds(opts.seeds)
    if opts.workers < 1:
        raise UserError(f"--workers must be >= 1, got {opts.workers}")
    spec = PolicySpec.parse(opts.policy, env=opts.env)  # a bad spec fails here, not in every worker
    resolve(opts.device)  # so does a device this machine lacks
    if opts.perturb:
        if spec.kind != "ckpt" or opts.env != "carracing":
            raise UserError("--perturb applies to a trained controller (--ckpt PATH) on carracing")
        try:
            parse_shift(opts.perturb)
        except ValueError as exc:
            raise UserError(f"--perturb: {exc}") from None
    base = {"env": opts.env, "max_episode_steps": opts.max_episode_steps}
    out: dict[str, Any] = {"policy": portable(opts.policy), "env": opts.env, "seeds": seeds, **base}
    start = time.perf_counter()
    if spec.kind != "ckpt":
        records = _episodes(opts, spec, seeds, base, phase_label(""), observers)
        return {**out, **summarise_returns(records), "wall_s": time.perf_counter() - start, "episodes": records}
    header, variants = _controller_variants(opts, spec)
    out.update(header, perturb=opts.perturb or None)
    # failure prediction reads the run without a fallback: the last one (absent when a study pairs the twins itself)
    failures = opts.failure_horizon > 0 and opts.env == "carracing" and (len(variants) > 1 or "fallback" not in header)
    runs = {}
    for name, variant in variants:
        settings = {**base, "perturb": opts.perturb, "failures": failures}
        label = phase_label(name, fallback=len(variants) > 1)
        runs[name] = _episodes(opts, variant, seeds, settings, label, observers if not name else None)
    if failures:
        out.update(_failure_prediction(opts, variants[-1][1], base, runs))
    records = runs[""]
    out.update(summarise_returns(records))
    out.update(aggregate(records))
    if "no_fallback" in runs:
        plain = runs["no_fallback"]
        for record, other in zip(records, plain, strict=True):
            record["return_no_fallback"] = other["return"]
        without = summarise_returns(plain)
        out.update({f"{k}_no_fallback": without[k] for k in ("mean_return", "std_return", "min_return")})
        out["episodes_no_fallback"] = plain
    out["wall_s"] = time.perf_counter() - start
    out["episodes"] = records
    return out


def _failure_prediction(
    opts: EvalOptions,
    plain: PolicySpec,
    base: Mapping[str, Any],
    runs: Mapping[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """Thresholds from nominal laps (clean camera, no fallback) on --calibrate-seeds, then each run's report; the
    per-step traces leave the records (their events stay)."""
    settings = {**base, "failures": True}
    laps = _episodes(opts, plain, parse_seeds(opts.calibrate_seeds), settings, phase_label("nominal"), None)
    nominal = split_traces(laps)
    thresholds = nominal_thresholds(np.concatenate([ep["signals"] for ep in nominal]), FallbackConfig().quantile)
    out = {}
    for name, records in runs.items():
        report = failure_report(split_traces(records), thresholds, opts.failure_horizon)
        out["failure_prediction" + (f"_{name}" if name else "")] = {**report, "calibrate_seeds": opts.calibrate_seeds}
    return out


def describe(results: Mapping[str, Any]) -> str:
    """The controller-specific lines printed under the episode table."""
    lines = []
    r = results
    if "coverage90_steer" in r:
        lines.append(
            f"shadow expert ({r.get('shadow')}): coverage50_steer {r['coverage50_steer']:.3f}, "
            f"coverage90_steer {r['coverage90_steer']:.3f}, nll_expert {r['nll_expert']:.3f}"
        )
    if "latency_ms_p50" in r:
        lines.append(f"controller latency per step: p50 {r['latency_ms_p50']:.2f} ms, p95 {r['latency_ms_p95']:.2f} ms")
    if "fallback" in r:
        fb = r["fallback"]
        lines.append(
            f"fallback {fb['mode']} (threshold {fb['threshold']:.3g}, {fb['threshold_origin']}): "
            f"{r.get('n_interventions', 0)} interventions, {r.get('fallback_fraction', 0):.1%} of steps; "
            f"mean_return {r['mean_return']:.1f} with, "
            f"{r['mean_return_no_fallback']:.1f} without"
        )
    for key in sorted(k for k in r if k.startswith("failure_prediction")):
        fp = r[key]
        events = ", ".join(f"{kind} {n}" for kind, n in fp["events"].items())
        head = f"{key} (events: {events}; H={fp['horizon']} steps): "
        if not any(row["auroc"] is not None for row in fp["signals"].values()):  # no event, or every step before one
            lines.append(head + "nothing to score (AUROC needs steps both near and far from an event)")
            continue
        parts = []
        for name, row in fp["signals"].items():
            auroc = "n/a" if row["auroc"] is None else format(row["auroc"], ".3f")
            lead = row.get("median_lead_steps")
            lead_text = "n/a" if lead is None else f"{lead:.0f} steps"
            parts.append(f"{name} AUROC {auroc}, median lead {lead_text}")
        lines.append(head + ", ".join(parts))
    return "\n".join(lines)
