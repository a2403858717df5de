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
    return [
        _episode(env, policy, episode, seed, observers) for episode, seed in enumerate(_seed_list(n_episodes, seeds))
    ]


def _episode(env: gym.Env, policy: Policy, episode: int, seed: int, observers: list[Observer]) -> EpisodeResult:
    low, high = env.action_space.low, env.action_space.high  # type: ignore[attr-defined]
    policy.reset(seed=seed)
    obs, info = env.reset(seed=seed)
    total, off_events, t = 0.0, 0, 0
    was_off = bool(info.get("off_track", False))
    terminated = truncated = False
    while not (terminated or truncated):
        out = policy.act(obs, info)
        if not isinstance(out, PolicyOutput):
            out = PolicyOutput(np.asarray(out, np.float32))
        action = np.clip(np.asarray(out.action, np.float32), low, high)
        label = action if out.label is None else np.asarray(out.label, np.float32)
        next_obs, reward, terminated, truncated, next_info = env.step(action)
        total += float(reward)
        is_off = bool(next_info.get("off_track", False))
        off_events += int(is_off and not was_off)
        was_off = is_off
        record = StepRecord(seed, episode, t, obs, info, action, label, out, float(reward), bool(terminated),
                            bool(truncated), next_obs, next_info)  # fmt: skip
        for observer in observers:
            observer(record)
        t += 1
        obs, info = next_obs, next_info
    summary = getattr(policy, "episode_summary", None)  # optional per-episode figures from the policy
    result = EpisodeResult(
        seed=seed,
        return_=total,
        completion=float(info.get("progress", float("nan"))),
        steps=t,
        tiles=int(info.get("tiles_visited", -1)),
        n_tiles=int(info.get("n_tiles", -1)),
        off_track_events=off_events,
        lap_finished=bool(info.get("lap_finished", False)),
        terminated=bool(terminated),
        truncated=bool(truncated),
        extras=dict(summary()) if callable(summary) else {},
    )
    log.info("seed %d: return %.1f, completion %.3f, %d steps", seed, total, result.completion, t)
    return result
