"""The bare-env rows of `drive bench closedloop`: stock CarRacing-v3, our env and EnvPool's C++ CarRacing, each on the
same two action streams -- random actions, and the expert's driving replayed open loop.

Random actions (gas and brake both uniform) mostly leave the car crawling near the start; the expert drives the lap
at speed, with other frames to draw (what `drive collect` and `drive eval` see), so their ratios are given against
the driving rows too. The expert's actions are recorded once in a state-mode env (same physics, no frames), episode
by episode on the collect rows' seeds; replayed in stock gymnasium or our env they drive the very same laps (the
physics is gymnasium's, bit for bit). EnvPool builds other tracks from a seed, so there the same actions are only a
similar driving load (its row is labelled so). Our env in state mode on the same laps (physics, reward and
privileged state, no frame drawn) is the floor under every pixel row: what a step costs before any drawing.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

ENV_ROWS = ("stock", "renderer", "envpool", "stock_driving", "renderer_driving", "envpool_driving", "state_driving")
ENV_LABELS = {"stock": "stock CarRacing-v3, random", "renderer": "our env (fast renderer), random",
              "envpool": "EnvPool CarRacing-v2, random", "stock_driving": "stock CarRacing-v3, expert replayed",
              "renderer_driving": "our env, expert replayed",
              "envpool_driving": "EnvPool, expert's actions (its own tracks)",
              "state_driving": "our env, state mode (no frame), expert replayed"}  # fmt: skip
Episodes = list[tuple[int, np.ndarray]]  # (track seed, (T, 3) actions) per episode


class EnvRowsConfig(Protocol):
    """What these rows read of `drive bench closedloop`'s Config."""

    @property
    def steps(self) -> int: ...

    @property
    def rounds(self) -> int: ...

    @property
    def max_episode_steps(self) -> int: ...

    @property
    def first_seed(self) -> int: ...

    @property
    def expert(self) -> str: ...

    @property
    def envpool_python(self) -> str | None: ...


@dataclass(frozen=True)
class Row:
    """One loop as measured (or `skipped`, saying why not)."""

    label: str
    steps: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0  # this process and its workers; EnvPool's subprocess measures its own
    skipped: str = ""
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def steps_per_s(self) -> float | None:
        return self.steps / self.wall_s if self.steps else None

    @property
    def steps_per_cpu_s(self) -> float | None:
        return self.steps / self.cpu_s if self.steps else None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "steps_per_s": self.steps_per_s, "steps_per_cpu_s": self.steps_per_cpu_s}


def _cpu_seconds() -> float:
    """User + system CPU of this process and its reaped children (a pool's workers, once joined)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(run: Callable[[], int]) -> tuple[int, float, float]:
    cpu, wall = _cpu_seconds(), time.perf_counter()
    steps = run()
    return steps, time.perf_counter() - wall, _cpu_seconds() - cpu


def random_actions(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform([-1.0, 0.0, 0.0], [1.0, 1.0, 1.0], size=(n, 3)).astype(np.float32)


def random_episodes(n: int, seed: int, first_seed: int, limit: int) -> Episodes:
    """`n` random actions cut into episodes of at most `limit` steps on seeds first_seed, first_seed + 1, ..."""
    actions = random_actions(n, seed)
    return [(first_seed + i, actions[a : a + limit]) for i, a in enumerate(range(0, n, limit))]


def expert_episodes(expert: str, n: int, first_seed: int, limit: int) -> Episodes:
    """The expert's actions on seeds first_seed, first_seed + 1, ... until `n` steps (episodes of at most `limit`)."""
    from drive.loop.specs import load_expert
    from sim_bridges.carracing.bridge import make_carracing

    driver = load_expert(expert)
    env = make_carracing(mode="state", max_episode_steps=limit)
    episodes: Episodes = []
    total, seed = 0, first_seed
    try:
        while total < n:
            driver.reset()
            _, info = env.reset(seed=seed)
            actions: list[np.ndarray] = []
            done = False
            while not done and total + len(actions) < n:
                actions.append(np.asarray(driver.act(info["state"]), np.float32))
                _, _, terminated, truncated, info = env.step(actions[-1])
                done = terminated or truncated
            episodes.append((seed, np.array(actions, np.float32).reshape(-1, 3)))
            total, seed = total + len(actions), seed + 1
    finally:
        env.close()
    return episodes


def replay(env: Any, episodes: Episodes) -> int:
    """Replay each episode's actions from its seed (an env that ends an episode sooner moves on); steps taken."""
    n = 0
    for seed, actions in episodes:
        env.reset(seed=seed)
        for action in actions:
            _, _, terminated, truncated, _ = env.step(action)
            n += 1
            if terminated or truncated:
                break
    return n


def gym_loop_env(which: str, limit: int) -> Any:
    """stock: gymnasium's CarRacing-v3; renderer: our pixel env; state: our env in state mode."""
    import gymnasium as gym

    from sim_bridges.carracing.bridge import make_carracing

    if which == "stock":
        return gym.make("CarRacing-v3", max_episode_steps=limit)
    return make_carracing("state" if which == "state" else "pixels", max_episode_steps=limit)


def gym_loop(which: str, episodes: Episodes, limit: int) -> tuple[int, float, float]:
    env = gym_loop_env(which, limit)
    try:
        return timed(lambda: replay(env, episodes))
    finally:
        env.close()


Bare = Callable[[], dict[str, tuple[int, float, float]]]  # our env on both streams: (steps, wall s, CPU s) each


def bare_env(cfg: EnvRowsConfig) -> Bare:
    """What each loop row of `drive bench closedloop` is divided by: our env on `cfg.steps` random actions and on the
    expert's laps (the `renderer` and `renderer_driving` rows' streams), measured again right beside that loop row
    (drive/studies/closedloop/loops.py), so that a ratio's two sides meet the same state of a shared machine, not
    ones minutes apart (CPU time per step drifts by 2x in minutes, seen)."""
    limit = cfg.max_episode_steps
    streams = {
        "renderer": random_episodes(cfg.steps, cfg.first_seed, cfg.first_seed, limit),
        "renderer_driving": expert_episodes(cfg.expert, cfg.steps, cfg.first_seed, limit),
    }
    return lambda: {key: gym_loop("renderer", episodes, limit) for key, episodes in streams.items()}


# run by --envpool-python: one env on one thread, the actions from stdin; prints one JSON line
ENVPOOL_SCRIPT = """
import json, sys, time
import numpy as np
try:
    import envpool
except ImportError as exc:
    print(json.dumps({"skipped": f"envpool does not import in {sys.executable} ({exc})"}))
    raise SystemExit(0)
limit, seed = int(sys.argv[1]), int(sys.argv[2])
actions = np.frombuffer(sys.stdin.buffer.read(), dtype=np.float32).reshape(-1, 1, 3)
env = envpool.make("CarRacing-v2", env_type="gymnasium", num_envs=1, num_threads=1, seed=seed,
                   max_episode_steps=limit)
env.reset()
cpu, wall = time.process_time(), time.perf_counter()
for action in actions:
    env.step(action)  # an episode's end resets it on the next step
print(json.dumps({"steps": len(actions), "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}))
"""


def envpool_loop(actions: np.ndarray, cfg: EnvRowsConfig) -> tuple[int, float, float] | str:
    """(steps, wall s, CPU s) of EnvPool in `--envpool-python`, or why it did not run."""
    python = cfg.envpool_python or sys.executable
    try:
        done = subprocess.run(
            [python, "-c", ENVPOOL_SCRIPT, str(cfg.max_episode_steps), str(cfg.first_seed)],
            input=actions.tobytes(),
            capture_output=True,
            timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python}: {exc}"
    lines = done.stdout.decode().strip().splitlines()
    if done.returncode != 0 or not lines:
        return f"{python} failed (exit {done.returncode}): {done.stderr.decode().strip()[-300:]}"
    got = json.loads(lines[-1])
    return got["skipped"] if "skipped" in got else (int(got["steps"]), float(got["wall_s"]), float(got["cpu_s"]))


def warm_up(limit: int) -> float:
    """CPU seconds of one step of stock gymnasium and of our env, each in a new env: pygame's font, numba's kernels
    loaded from their cache (or compiled), first-call costs the timed rows should not carry (EnvPool's subprocess
    times its step loop only, after its import and env construction)."""

    def one_step_each() -> int:
        for which in ("stock", "renderer"):
            env = gym_loop_env(which, limit)
            try:
                replay(env, random_episodes(1, 0, 0, limit))
            finally:
                env.close()
        return 2

    return timed(one_step_each)[2]


def measure_envs(cfg: EnvRowsConfig, console: Any) -> dict[str, Row]:
    """The env rows: `cfg.rounds` rounds alternating the envs' order, per action stream, summed per row."""
    limit = cfg.max_episode_steps
    with console.status("recording the expert's driving ..."):
        driving = expert_episodes(cfg.expert, cfg.steps, cfg.first_seed, limit)
    runs: dict[str, list[tuple[int, float, float]]] = {key: [] for key in ENV_ROWS}
    note = ""  # why EnvPool did not run
    for r in range(cfg.rounds):
        streams = {"": random_episodes(cfg.steps, cfg.first_seed + r, cfg.first_seed, limit), "_driving": driving}
        for suffix, episodes in streams.items():
            envs = ("stock", "renderer", "envpool") + (("state",) if suffix else ())
            for env in envs[:: 1 if r % 2 == 0 else -1]:
                key = env + suffix
                if env == "envpool" and note:
                    continue
                with console.status(f"round {r + 1}/{cfg.rounds}: {ENV_LABELS[key]} ..."):
                    got = (
                        envpool_loop(np.concatenate([a for _, a in episodes]), cfg)
                        if env == "envpool"
                        else gym_loop(env, episodes, limit)
                    )
                note = got if isinstance(got, str) else note
                runs[key] += [] if isinstance(got, str) else [got]
    if note:
        console.print(f"EnvPool rows skipped: {note}")
    rows = {key: Row(ENV_LABELS[key], skipped=note) for key in ENV_ROWS if note and key.startswith("envpool")}
    for key in ENV_ROWS:
        if key not in rows:
            steps, wall, cpu = (sum(column) for column in zip(*runs[key], strict=True))
            per_round = [n / c for n, _, c in runs[key]]
            rows[key] = Row(ENV_LABELS[key], int(steps), wall, cpu, detail={"per_round_steps_per_cpu_s": per_round})
    return {key: rows[key] for key in ENV_ROWS}
