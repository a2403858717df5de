"""The closed loop: one plain function, `rollout(env, policy, seeds=..., on_step=...)`, and the typed data it passes.

A policy is anything with `reset(seed=None)` and `act(obs, info) -> action | PolicyOutput` (and optionally
`episode_summary() -> dict`, merged into the episode's result: latency, calibration, interventions). Everything
that watches the loop — the demonstration recorder, video, the interpretability trace, the live window, the
Udacity step log — is an observer: a callable given one `StepRecord` per step. No subclassing of the loop.

What a policy hands the loop each step is typed (`PolicyOutput`): the action to execute, the clean label it stands
behind (an expert's action before DART noise; defaults to the action), who chose it (`source`), and, for a trained
controller, its `StepPrediction` (mean, aleatoric and epistemic variance per action dimension), its `Internals`
(NSAC's kappa, phi, psi, logits, attention, with the axes an observer needs to summarise them), the shadow expert's
action, the step latency, the fallback gate's state (`GateStep`) and the coded frame it saw; the Udacity policies
add their speed loop (`SpeedStep`) and road trace (`RoadStep`). Observers read fields, never string keys.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepPrediction:
    """A controller's predictive Gaussian for one step, per action dimension (D,) each."""

    mean: np.ndarray
    aleatoric_var: np.ndarray
    epistemic_var: np.ndarray

    @property
    def total_var(self) -> np.ndarray:
        return self.aleatoric_var + self.epistemic_var


@dataclass(frozen=True)
class Internals:
    """A controller's internal tensors of one step (batch axis dropped) and how to summarise them per head."""

    values: Mapping[str, np.ndarray]
    head_axes: Mapping[str, int] = field(default_factory=dict)
    """the axis that holds the attention heads in each value (names absent: not per head)"""
    indices: tuple[str, ...] = ()
    """values that are indices, not measurements (recorded whole, never averaged)"""


@dataclass(frozen=True)
class GateStep:
    """The uncertainty-gated fallback at one step."""

    state: str  # "controller" (armed, not engaged), "expert" or "slow" (engaged)
    score: float
    threshold: float
    signal: str

    @property
    def engaged(self) -> bool:
        return self.state != "controller"


@dataclass(frozen=True)
class SpeedStep:
    """The Udacity speed loop at one step."""

    speed_mph: float
    target_mph: float
    gated: bool
    slowdown: float = 0.0


@dataclass(frozen=True)
class RoadStep:
    """The vision road follower's trace of the road at one step (for the overlay)."""

    rows: int
    line: np.ndarray  # (R, 2) grid (row, col) of the traced road centre
    grid: tuple[int, int]


def clip_action(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """np.clip(action, low, high) for array bounds, the same bits (NaN passes, a tie gives the bound: tests/drive/
    loop/test_rollout.py) at a third of its cost on an action's few values: every closed-loop step clips."""
    return np.minimum(np.maximum(action, low), high)


@dataclass(frozen=True)
class PolicyOutput:
    action: np.ndarray  # (A,) to execute (after DART noise, after a fallback switch, ...)
    label: np.ndarray | None = None  # (A,) the clean action the policy stands behind; None: same as action
    source: str = "policy"  # who chose the action: policy, expert (fallback or DAgger), slow
    prediction: StepPrediction | None = None
    internals: Internals | None = None
    expert: np.ndarray | None = None  # (A,) the shadow expert's action on the same state
    latency_ms: float = math.nan
    gate: GateStep | None = None
    frame: np.ndarray | None = None  # (84, 84) the newest coded frame the controller saw
    speed: SpeedStep | None = None
    road: RoadStep | None = None


class Policy(Protocol):
    def reset(self, seed: int | None = None) -> None: ...

    def act(self, obs: Any, info: Mapping[str, Any]) -> np.ndarray | PolicyOutput: ...


@dataclass(frozen=True)
class StepRecord:
    """One transition as observers see it: the policy saw (obs, info), chose, the env answered."""

    seed: int
    episode: int  # index of the episode within this rollout call
    t: int  # step index within the episode, from 0
    obs: Any  # what the policy saw
    info: Mapping[str, Any]  # the info that came with obs (privileged state, pose, progress, ...)
    action: np.ndarray  # executed, clipped to the action space
    label: np.ndarray  # the clean action the policy stands behind
    output: PolicyOutput  # everything else the policy reported
    reward: float
    terminated: bool
    truncated: bool
    next_obs: Any
    next_info: Mapping[str, Any]

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def source(self) -> str:
        return self.output.source


@dataclass(frozen=True)
class EpisodeResult:
    seed: int
    return_: float
    completion: float  # fraction of track tiles visited at the end
    steps: int
    tiles: int
    n_tiles: int
    off_track_events: int  # on-track -> off-track transitions
    lap_finished: bool
    terminated: bool
    truncated: bool
    first_off_track: int = -1  # the step of the first on -> off transition (-1: none)
    extras: Mapping[str, Any] = field(default_factory=dict)  # the policy's episode_summary()

    def to_dict(self) -> dict[str, Any]:
        out = {
            "seed": self.seed,
            "return": self.return_,
            "completion": self.completion,
            "steps": self.steps,
            "tiles": self.tiles,
            "n_tiles": self.n_tiles,
            "off_track_events": self.off_track_events,
            "first_off_track": self.first_off_track,
            "lap_finished": self.lap_finished,
            "terminated": self.terminated,
            "truncated": self.truncated,
        }
        out.update(self.extras)
        return out


Observer = Callable[[StepRecord], None]


def _seed_list(n_episodes: int | None, seeds: Iterable[int] | None) -> list[int]:
    if seeds is None:
        if n_episodes is None:
            raise ValueError("rollout needs seeds or n_episodes")
        return list(range(n_episodes))
    chosen = [int(s) for s in seeds]
    if n_episodes is not None:
        if n_episodes > len(chosen):
            raise ValueError(f"n_episodes={n_episodes} but only {len(chosen)} seeds given")
        chosen = chosen[:n_episodes]
    return chosen


def rollout(
    env: gym.Env,
    policy: Policy,
    n_episodes: int | None = None,
    seeds: Iterable[int] | None = None,
    on_step: Observer | Sequence[Observer] | None = None,
) -> list[EpisodeResult]:
    """Run `policy` in `env` for one episode per seed (the track seed given to env.reset).

    `seeds` defaults to 0..n_episodes-1; with both given, the first n_episodes seeds run.
    """
    observers: list[Observer] = [] if on_step is None else [on_step] if callable(on_step) else list(on_step)
    return run_lanes([Lane(env, policy, observers)], _seed_list(n_episodes, seeds))


@dataclass
class Lane:
    """One car of `run_lanes`: its env, its policy (episode state of its own) and its observers."""

    env: gym.Env
    policy: Policy
    observers: Sequence[Observer] = ()


def _act_each(policies: Sequence[Policy], obs: Sequence[Any], infos: Sequence[Mapping[str, Any]]) -> list[Any]:
    return [p.act(o, i) for p, o, i in zip(policies, obs, infos, strict=True)]


@dataclass
class _Running:
    """A lane's episode in progress."""

    episode: int
    seed: int
    obs: Any
    info: Mapping[str, Any]
    was_off: bool
    total: float = 0.0
    off_events: int = 0
    first_off: int = -1
    t: int = 0
    terminated: bool = False
    truncated: bool = False


def run_lanes(
    lanes: Sequence[Lane],
    seeds: Sequence[int],
    act: Callable[[Sequence[Policy], Sequence[Any], Sequence[Mapping[str, Any]]], list[Any]] = _act_each,
    on_episode: Callable[[int, EpisodeResult], None] | None = None,
) -> list[EpisodeResult]:
    """One episode per seed on K lanes at once: each lane takes the next seed when its episode ends, and every step
    `act` answers all running lanes together (drive/loop/policies.py `act_lanes`: one controller call). Each lane
    steps its own env, policy and observers exactly as a one-lane run would, so an episode's result depends on its
    seed, not on K. `on_episode(lane index, result)` runs as each episode ends (before that lane starts the next);
    the return value is in seed order."""
    queue = list(enumerate(seeds))[::-1]
    results: dict[int, EpisodeResult] = {}
    running: list[_Running | None] = [None] * len(lanes)

    def start(j: int) -> None:
        if not queue:
            running[j] = None
            return
        episode, seed = queue.pop()
        lanes[j].policy.reset(seed=seed)
        obs, info = lanes[j].env.reset(seed=seed)
        running[j] = _Running(episode, seed, obs, info, bool(info.get("off_track", False)))

    for j in range(len(lanes)):
        start(j)
    bounds = [(lane.env.action_space.low, lane.env.action_space.high) for lane in lanes]  # type: ignore[attr-defined]
    while any(r is not None for r in running):
        active = [j for j, r in enumerate(running) if r is not None]
        states = [running[j] for j in active]
        outs = act([lanes[j].policy for j in active], [r.obs for r in states], [r.info for r in states])  # type: ignore[union-attr]
        for j, run, out in zip(active, states, outs, strict=True):
            assert run is not None
            if _step(lanes[j], run, out, *bounds[j]):
                result = _result(lanes[j].policy, run)
                results[run.episode] = result
                if on_episode is not None:
                    on_episode(j, result)
                start(j)
    return [results[i] for i in range(len(seeds))]


def _step(lane: Lane, run: _Running, out: Any, low: np.ndarray, high: np.ndarray) -> bool:
    """Execute one step of a lane's episode (its action clipped to [low, high]); True when the episode ended."""
    env = lane.env
    if not isinstance(out, PolicyOutput):
        out = PolicyOutput(np.asarray(out, np.float32))
    action = clip_action(np.asarray(out.action, np.float32), low, high)
    label = action if out.label is None else np.asarray(out.label, np.float32)
    next_obs, reward, terminated, truncated, next_info = env.step(action)
    run.total += float(reward)
    is_off = bool(next_info.get("off_track", False))
    if is_off and not run.was_off:
        run.off_events += 1
        run.first_off = run.t if run.first_off < 0 else run.first_off
    run.was_off = is_off
    record = StepRecord(
        run.seed,
        run.episode,
        run.t,
        run.obs,
        run.info,
        action,
        label,
        out,
        float(reward),
        bool(terminated),
        bool(truncated),
        next_obs,
        next_info,
    )
    for observer in lane.observers:
        observer(record)
    run.t += 1
    run.obs, run.info = next_obs, next_info
    run.terminated, run.truncated = bool(terminated), bool(truncated)
    return run.terminated or run.truncated


def _result(policy: Policy, run: _Running) -> EpisodeResult:
    info = run.info
    summary = getattr(policy, "episode_summary", None)  # optional per-episode figures from the policy
    result = EpisodeResult(
        seed=run.seed,
        return_=run.total,
        completion=float(info.get("progress", float("nan"))),
        steps=run.t,
        tiles=int(info.get("tiles_visited", -1)),
        n_tiles=int(info.get("n_tiles", -1)),
        off_track_events=run.off_events,
        first_off_track=run.first_off,
        lap_finished=bool(info.get("lap_finished", False)),
        terminated=run.terminated,
        truncated=run.truncated,
        extras=dict(summary()) if callable(summary) else {},
    )
    log.info("seed %d: return %.1f, completion %.3f, %d steps", run.seed, run.total, result.completion, run.t)
    return result
