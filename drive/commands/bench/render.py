"""Quick figures for the fast CarRacing renderer: per-frame render time vs stock on identical states, and steps/s.

Run `drive bench render [--steps N] [--seed S] [--profile] [--breakdown]`. Frames are timed interleaved on the
same env state (stock `_render("state_pixels")`, then ours, alternating which goes first), and medians of
CPU time are reported, so a busy shared machine skews both sides alike. `--breakdown` times where a step of our env
goes, stage by stage (wall-clock timers around the kernels, ~0.3 us each; nested stages are included in their
parent's figure), while the PPO expert drives `--steps` steps from track `--seed`. Not a test: nothing here asserts
a speed.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from dataclasses import dataclass

import numpy as np

from drive.options import NonNegativeInt, PositiveInt


@dataclass(frozen=True)
class Config:
    steps: PositiveInt = 400
    """steps per measurement"""
    seed: NonNegativeInt = 0
    """track seed"""
    profile: bool = False
    """also print a cProfile of the fast step loop"""
    breakdown: bool = False
    """also print where a step of our env goes, stage by stage, while the PPO expert drives"""


def _actions(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.array([rng.uniform(-1, 1), rng.uniform(0.2, 1), 0.0]) for _ in range(n)]


def first_frame_seconds(seed: int) -> float:
    """Wall time of the first fast frame in this process: numba compiling `sim_bridges.carracing.raster`/`shrink`, or
    loading them from numba's on-disk cache (`cache=True`) when an earlier process compiled them."""
    from gymnasium.envs.box2d.car_racing import CarRacing

    from sim_bridges.carracing.fast_render import render_state_pixels

    env = CarRacing()
    env.reset(seed=seed)
    t0 = time.perf_counter()
    render_state_pixels(env)
    return time.perf_counter() - t0


def frame_times(n_steps: int, seed: int) -> tuple[list[float], list[float]]:
    from gymnasium.envs.box2d.car_racing import CarRacing  # Box2D and pygame: not for `--help`

    from sim_bridges.carracing.fast_render import render_state_pixels

    """CPU seconds per frame, stock and fast, each measured on the same state after every step."""
    env = CarRacing()
    env.reset(seed=seed)
    # physics only while stepping; frames are rendered below
    env._render = lambda mode: None  # type: ignore[method-assign]  # patching the renderer for the benchmark
    stock_render = CarRacing._render.__get__(env)
    stock: list[float] = []
    fast: list[float] = []
    for k, a in enumerate(_actions(n_steps, seed)):
        env.step(a)
        for which in (0, 1) if k % 2 else (1, 0):
            t0 = time.process_time()
            out = stock_render("state_pixels") if which == 0 else render_state_pixels(env)
            (stock if which == 0 else fast).append(time.process_time() - t0)
            if which == 0:
                ref = out
            else:
                got = out
        if not np.array_equal(ref, got):
            raise RuntimeError(f"frame {k}: the fast renderer differs from the stock one")
    return stock, fast


def steps_per_second(n_steps: int, seed: int, mode: str) -> float:
    from gymnasium.envs.box2d.car_racing import CarRacing

    from sim_bridges.carracing.fast_render import render_state_pixels

    env = CarRacing()
    if mode == "fast":
        env._render = lambda mode: render_state_pixels(env)  # type: ignore[method-assign]  # the fast renderer
    elif mode == "physics":
        env._render = lambda mode: None  # type: ignore[method-assign]  # physics only
    env.reset(seed=seed)
    actions = _actions(n_steps, seed)
    t0 = time.perf_counter()
    for a in actions:
        env.step(a)
    return n_steps / (time.perf_counter() - t0)


# (depth, label, module, attribute): the stages `breakdown` times, in the order a step runs them
STAGES = (
    (0, "env step (drive/CarRacing-v0)", "sim_bridges.carracing.bridge", "CarRacingBridge.step"),
    (1, "gymnasium step: physics, reward, frame", "gymnasium.envs.box2d.car_racing", "CarRacing.step"),
    (2, "car dynamics (Python)", "gymnasium.envs.box2d.car_dynamics", "Car.step"),
    (2, "frame (render_state_pixels)", "sim_bridges.carracing.fast_render", "render_state_pixels"),
    (3, "culling and view maths", "sim_bridges.carracing.view", "visible_polygons"),
    (3, "world: fills and anti-aliased edges", "sim_bridges.carracing.raster", "draw_world"),
    (3, "car: vertices", "sim_bridges.carracing.view", "car_screen"),
    (3, "car: fills", "sim_bridges.carracing.raster_car", "draw_car"),
    (3, "X shrink, world and bar rows", "sim_bridges.carracing.shrink", "shrink_rows"),
    (3, "bar and score (their X shrink also above)", "sim_bridges.carracing.indicators", "shrink_bar"),
    (3, "Y shrink", "sim_bridges.carracing.shrink", "shrink_columns"),
    (1, "privileged state", "sim_bridges.carracing.bridge", "CarRacingBridge.privileged_state"),
)


def breakdown(n_steps: int, seed: int) -> list[tuple[int, str, float]]:
    """Mean wall microseconds per env step of each stage in `STAGES` while the PPO expert drives."""
    from drive.loop.specs import load_expert
    from drive.studies.closedloop.stages import stage_timers
    from sim_bridges.carracing.bridge import make_carracing

    expert = load_expert("ppo")
    with stage_timers(STAGES) as spent:  # before the env is made: it keeps a reference to the frame function
        env = make_carracing()
        try:
            _, info = env.reset(seed=seed)  # compiles or loads the kernels: not counted
            spent[:] = [0] * len(STAGES)
            steps = 0
            while steps < n_steps:
                _, _, terminated, truncated, info = env.step(expert.act(info["state"]))
                steps += 1
                if terminated or truncated:
                    _, info = env.reset(seed=seed + steps)
        finally:
            env.close()
    return [(depth, label, spent[i] / steps / 1e3) for i, (depth, label, _, _) in enumerate(STAGES)]


def coding_times(n_steps: int, seed: int) -> tuple[list[float], list[float]]:
    """CPU seconds per frame of the `full` coding (datasets/area_gray.py) and of the cv2 calls it equals, each on
    the same frames of our env (random actions), interleaved."""
    import cv2

    from datasets.frames import code_full
    from drive.loop.envs import make_env

    cv2.setNumThreads(1)  # one core, as the closed loop's workers
    env = make_env("carracing", max_episode_steps=n_steps + 1)
    env.reset(seed=seed)
    frames = [np.ascontiguousarray(env.step(a)[0]) for a in _actions(n_steps, seed)]
    env.close()
    ours: list[float] = []
    theirs: list[float] = []
    code_full(frames[0])  # numba's kernel loaded
    for rgb in frames:
        for times, code in ((ours, code_full), (theirs, cv2_full)):
            t0 = time.process_time()
            code(rgb)
            times.append(time.process_time() - t0)
    return ours, theirs


def cv2_full(rgb: np.ndarray) -> np.ndarray:
    import cv2

    return cv2.cvtColor(cv2.resize(rgb, (84, 84), interpolation=cv2.INTER_AREA), cv2.COLOR_RGB2GRAY)


def run(cfg: Config) -> int:
    print(f"first fast frame (numba compile or cache load): {first_frame_seconds(cfg.seed):.2f} s")
    stock, fast = frame_times(cfg.steps, cfg.seed)
    ms_s, ms_f = 1e3 * statistics.median(stock), 1e3 * statistics.median(fast)
    print(f"render per frame (median of {cfg.steps}): stock {ms_s:.3f} ms, fast {ms_f:.3f} ms, x{ms_s / ms_f:.2f}")
    rates = {mode: steps_per_second(cfg.steps, cfg.seed, mode) for mode in ("stock", "fast", "physics")}
    print(
        f"env steps/s: stock {rates['stock']:.0f}, fast {rates['fast']:.0f} (x{rates['fast'] / rates['stock']:.2f}),"
        f" physics only {rates['physics']:.0f}"
    )
    ours, theirs = (1e6 * statistics.median(t) for t in coding_times(cfg.steps, cfg.seed))
    print(
        f"frame coding to 84x84 gray (median of {cfg.steps}): ours {ours:.1f} us, cv2 resize + cvtColor "
        f"{theirs:.1f} us, x{theirs / ours:.2f}"
    )
    if cfg.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        steps_per_second(cfg.steps, cfg.seed, "fast")
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    if cfg.breakdown:
        print(f"where a step goes (us per step, mean of {cfg.steps} steps of the PPO expert from seed {cfg.seed}):")
        for depth, label, us in breakdown(cfg.steps, cfg.seed):
            print(f"  {'  ' * depth}{label:<{50 - 2 * depth}} {us:8.1f}")
    return 0
