"""The closed loop: one plain function, `rollout(env, policy, seeds=..., on_step=...)`.

A policy is anything with `reset(seed=None)` and `act(obs, info) -> action | PolicyOutput` (and optionally
`episode_summary() -> dict`, merged into the episode's result, e.g. latency or interventions). Everything else that
watches the loop — the demonstration recorder, video, tracing, the interpretability recorder, fallback logging — is
an observer: a callable given one `StepRecord` per step. No subclassing of the loop.

`PolicyOutput` is how a policy tells observers more than the action it wants executed:
    action  what the env executes (after DART noise, after a fallback switch, ...)
    label   the clean action the policy stands behind (the expert's action before noise); defaults to action
    source  who chose the action ("policy", "expert" under a fallback, ...)
    extras  any per-step values for observers: predicted mean/aleatoric/epistemic, kappa/phi/psi, attention,
            the shadow expert's action, latency. The loop passes them through untouched.
Wrappers compose: NoisyPolicy(ExpertPolicy(expert)) executes a perturbed action and labels the clean one; a shadow
or fallback wrapper adds its own extras the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

log = logging.getLogger(__name__)


class Policy(Protocol):
    def reset(self, seed: int | None = None) -> None: ...

    def act(self, obs: Any, info: Mapping[str, Any]) -> np.ndarray | PolicyOutput: ...


@dataclass(frozen=True)
class PolicyOutput:
    action: np.ndarray  # (3,) executed
    label: np.ndarray | None = None  # (3,) clean action; None = same as action
    source: str = "policy"
    extras: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepRecord:
    """One transition as observers see it: the policy saw (obs, info), chose, the env answered."""

    seed: int
    episode: int  # index of the episode within this rollout call
    t: int  # step index within the episode, from 0
    obs: Any  # what the policy saw
    info: Mapping[str, Any]  # the info that came with obs (privileged state, pose, progress, ...)
    action: np.ndarray  # (3,) executed, clipped to the action space
    label: np.ndarray  # (3,) the clean action the policy stands behind
    source: str
    extras: Mapping[str, Any]
    reward: float
    terminated: bool
    truncated: bool
    next_obs: Any
    next_info: Mapping[str, Any]

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


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
    extras: Mapping[str, Any] = field(default_factory=dict)  # per-episode summaries added by later harness parts

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
    if seeds is None:
        if n_episodes is None:
            raise ValueError("rollout needs seeds or n_episodes")
        seeds = range(n_episodes)
    seeds = [int(s) for s in seeds]
    if n_episodes is not None:
        if n_episodes > len(seeds):
            raise ValueError(f"n_episodes={n_episodes} but only {len(seeds)} seeds given")
        seeds = seeds[:n_episodes]
    observers: list[Observer] = [] if on_step is None else [on_step] if callable(on_step) else list(on_step)
    low, high = env.action_space.low, env.action_space.high
    results = []
    for episode, seed in enumerate(seeds):
        policy.reset(seed=seed)
        obs, info = env.reset(seed=seed)
        total, off_events, t = 0.0, 0, 0
        was_off = bool(info.get("off_track", False))
        while True:
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
            record = StepRecord(
                seed,
                episode,
                t,
                obs,
                info,
                action,
                label,
                out.source,
                out.extras,
                float(reward),
                bool(terminated),
                bool(truncated),
                next_obs,
                next_info,
            )
            for observer in observers:
                observer(record)
            t += 1
            obs, info = next_obs, next_info
            if terminated or truncated:
                break
        summary = getattr(policy, "episode_summary", None)  # optional per-episode figures from the policy
        results.append(
            EpisodeResult(
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
        )
        log.info("seed %d: return %.1f, completion %.3f, %d steps", seed, total, results[-1].completion, t)
    return results


# -- adapters --------------------------------------------------------------------------------------------------------
class ExpertPolicy:
    """An expert (reset(), act(state) -> (3,)) as a closed-loop policy: it acts from info["state"], not pixels."""

    needs_pixels = False

    def __init__(self, expert: Any, name: str = "expert"):
        self.expert = expert
        self.name = name

    def reset(self, seed: int | None = None) -> None:
        self.expert.reset()

    def act(self, obs: Any, info: Mapping[str, Any]) -> np.ndarray:
        if "state" not in info:
            raise KeyError("ExpertPolicy needs info['state'] (privileged state) from the env")
        return np.asarray(self.expert.act(info["state"]), np.float32)


class NoisyPolicy:
    """DART noise injection: executes label + N(0, std^2), clipped; the label stays the clean action.

    The noise stream is seeded per episode from (track seed, noise_seed), so a rerun of the same episode executes the
    same actions (what makes a resumed collection identical to an uninterrupted one).
    """

    def __init__(self, policy: Policy, std: float, low: np.ndarray, high: np.ndarray, noise_seed: int = 0):
        if std < 0:
            raise ValueError(f"action noise std must be >= 0, got {std}")
        self.policy, self.std, self.noise_seed = policy, float(std), int(noise_seed)
        self.low, self.high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        self.needs_pixels = getattr(policy, "needs_pixels", True)
        self._rng = np.random.default_rng(self.noise_seed)

    def reset(self, seed: int | None = None) -> None:
        self.policy.reset(seed=seed)
        self._rng = np.random.default_rng([self.noise_seed, 0 if seed is None else int(seed)])

    def act(self, obs: Any, info: Mapping[str, Any]) -> PolicyOutput:
        out = self.policy.act(obs, info)
        inner = out if isinstance(out, PolicyOutput) else PolicyOutput(np.asarray(out, np.float32))
        clean = np.clip(np.asarray(inner.action, np.float32), self.low, self.high)
        noise = self.std * self._rng.standard_normal(clean.shape).astype(np.float32) if self.std else 0.0
        executed = np.clip(clean + noise, self.low, self.high)
        return PolicyOutput(executed, clean, inner.source, inner.extras)


# -- seeds -----------------------------------------------------------------------------------------------------------
def parse_seeds(spec: str) -> list[int]:
    """'A-B' (inclusive), 'A,B,C', or a mix: '0-4,10,20-22'. Order kept, duplicates refused."""
    seeds: list[int] = []
    for part in str(spec).replace(" ", "").split(","):
        if not part:
            continue
        try:
            if "-" in part[1:]:
                cut = part.index("-", 1)
                a, b = int(part[:cut]), int(part[cut + 1 :])
                if b < a:
                    raise ValueError
                seeds.extend(range(a, b + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise ValueError(f"bad seed spec {spec!r} at {part!r}: use 'A-B' (inclusive), 'A,B,C' or a mix") from None
    if not seeds:
        raise ValueError(f"seed spec {spec!r} names no seeds")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seed spec {spec!r} repeats a seed")
    return seeds


# -- what the loop runs in -------------------------------------------------------------------------------------------
ENVS = ("carracing", "fake-road")


def make_env(
    name: str = "carracing",
    *,
    pixels: bool = True,
    keep_raw: bool = False,
    max_episode_steps: int = 1000,
    frame_stack: int = 4,
    fast_render: bool = True,
) -> gym.Env:
    """The env a command drives: CarRacing through our bridge, or the fake road (tests). `pixels=False` asks for the
    state-only mode where the policy never looks at pixels (experts), which skips rendering entirely."""
    if name == "carracing":
        from sim_bridges.carracing import make_carracing

        return make_carracing(
            mode="pixels" if pixels or keep_raw else "state",
            frame_stack=frame_stack,
            fast_render=fast_render,
            keep_raw=keep_raw,
            max_episode_steps=max_episode_steps,
        )
    if name == "fake-road":
        from sim_bridges.fake_road import make_fake_road

        return make_fake_road(frame_stack=frame_stack, keep_raw=keep_raw, max_episode_steps=max_episode_steps)
    raise ValueError(f"unknown env {name!r}; choose from {ENVS}")


def load_expert_policy(name: str, env: str = "carracing") -> ExpertPolicy:
    """The expert `name` (ppo, pursuit or a checkpoint path) for `env`, as a closed-loop policy."""
    if env == "fake-road":
        from sim_bridges.fake_road import FakeRoadDriver

        if name != "pursuit":
            raise ValueError(f"the fake road has only its scripted driver: use expert 'pursuit', not {name!r}")
        return ExpertPolicy(FakeRoadDriver(), name="fake-road:pursuit")
    from drive.experts import load_expert

    return ExpertPolicy(load_expert(name), name=name)
