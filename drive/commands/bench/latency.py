"""`drive bench latency`: per-step controller latency in the closed loop, S stochastic samples vs deterministic.

What one closed-loop step costs the controller (drive/policies.py `ControllerPolicy.predict`: the (k, 84, 84)
frame stack to a tensor, `moments(x, S)`, the law of total variance), on ONE CPU thread, batch 1, over real
CarRacing observations recorded from a short drive (random frames would cost the same; real ones keep it honest):

- stochastic: S samples (default 32), the way `drive eval` runs the controller;
- deterministic: the same network without sampling. For NSAC, the attention layer's mean-logit path
  (`sample=False`: mu instead of mu + sigma eps, one pass); for the other controllers, one pass (S = 1).
The observation coding a checkpoint was trained with (drive/tasks/demos.py ObservationCoder: frame source, input
transform) is part of the step in both.

Targets (issue 4): stochastic p50 <= 5 ms and stochastic / deterministic <= 1.3x, reached when the encoder runs
once and only the attention head is sampled. Prints the figures and the ratio side by side; `--out` writes JSON.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from datasets.files import atomic_write
from drive.loop.options import SHIPPED_CONTROLLER
from drive.options import NonNegativeInt, PositiveInt

TARGET_MS, TARGET_RATIO = 5.0, 1.3


@dataclass(frozen=True)
class Config:
    ckpt: tuple[Path, ...] = ()
    """controller checkpoints to measure (default: checkpoints/carracing_nsac.pt, else an untrained NSAC)"""
    samples: PositiveInt = 32
    """stochastic samples per step"""
    steps: PositiveInt = 300
    """timed steps per configuration"""
    warmup: NonNegativeInt = 30
    """untimed steps first"""
    threads: PositiveInt = 1
    """torch CPU threads"""
    observations: PositiveInt = 64
    """distinct CarRacing observations cycled through (recorded from a short drive with the pursuit expert)"""
    out: Path | None = None
    """write the results JSON here"""


def _observations(n: int) -> list[np.ndarray]:
    """n raw (96, 96, 3) frames from a short pursuit drive in the pixel env."""
    from drive.loop.specs import load_expert  # torch and the simulator, in each function: not for `--help`
    from sim_bridges.carracing.bridge import make_carracing

    env = make_carracing(max_episode_steps=n + 1)
    expert = load_expert("pursuit")
    obs, info = env.reset(seed=4242)
    frames = []
    for _ in range(n):
        frames.append(obs)
        obs, _, term, trunc, info = env.step(expert.act(info["state"]))
        if term or trunc:
            obs, info = env.reset(seed=4243)
    env.close()
    return frames


def _step_fn(model, samples: int, deterministic: bool, coder):
    import torch

    from agents.base import Controller, total_variance

    generator = torch.Generator().manual_seed(0)

    def step(frame: np.ndarray) -> None:
        x = coder(frame)  # (1, k, 84, 84), coded as in training
        if deterministic and type(model).deterministic_pass is not Controller.deterministic_pass:
            model.deterministic_pass(x)  # its own pass without sampling (NSAC: the mean-logit path)
        elif deterministic:
            model.moments(x, 1, generator)
        else:
            total_variance(*model.moments(x, samples, generator))

    return step


def time_steps(model, obs, samples: int, deterministic: bool, steps: int, warmup: int, coder) -> np.ndarray:
    import torch

    step = _step_fn(model, samples, deterministic, coder)
    times = np.empty(steps)
    with torch.inference_mode():
        for i in range(warmup):
            step(obs[i % len(obs)])
        for i in range(steps):
            t0 = time.perf_counter()
            step(obs[i % len(obs)])
            times[i] = (time.perf_counter() - t0) * 1e3
    return times


def _models(cfg: Config):
    import torch

    from agents.encoders import EncoderConfig
    from agents.nsac import NSACConfig
    from datasets.frames import ObservationCoder
    from drive.checkpoint import load_controller

    paths = list(cfg.ckpt)
    if not paths and SHIPPED_CONTROLLER.is_file():
        paths = [SHIPPED_CONTROLLER]
    if paths:
        for path in paths:
            model, payload = load_controller(path)
            coder = ObservationCoder.from_fingerprint(payload.get("data", {}), payload["config"]["encoder"]["n_tokens"])
            yield f"{payload['name']} ({Path(path).name})", model, coder
        return
    torch.manual_seed(0)
    model = NSACConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=32), out_dim=3).build()
    yield "nsac (untrained)", model, ObservationCoder("full", "frames", 4)


def run(cfg: Config) -> int:
    import torch

    torch.set_num_threads(cfg.threads)
    obs = _observations(cfg.observations)
    results = []
    print(f"per-step controller latency, batch 1, {cfg.threads} thread(s), {cfg.steps} steps, S = {cfg.samples}")
    print(
        f"{'controller':<28} {'stochastic p50/p95 ms':>22} {'deterministic p50/p95 ms':>25} {'ratio p50':>10}  "
        f"targets (<= {TARGET_MS:g} ms, <= {TARGET_RATIO:g}x)"
    )
    for name, model, coder in _models(cfg):
        model.eval()
        # interleave the two measurements so background load hits both alike
        sto_runs: list[np.ndarray] = []
        det_runs: list[np.ndarray] = []
        for _ in range(3):
            sto_runs.append(time_steps(model, obs, cfg.samples, False, cfg.steps // 3, cfg.warmup, coder))
            det_runs.append(time_steps(model, obs, cfg.samples, True, cfg.steps // 3, cfg.warmup, coder))
        sto, det = np.concatenate(sto_runs), np.concatenate(det_runs)
        row = {
            "controller": name,
            "samples": cfg.samples,
            "stochastic_ms_p50": float(np.percentile(sto, 50)),
            "stochastic_ms_p95": float(np.percentile(sto, 95)),
            "deterministic_ms_p50": float(np.percentile(det, 50)),
            "deterministic_ms_p95": float(np.percentile(det, 95)),
        }
        row["ratio_p50"] = row["stochastic_ms_p50"] / row["deterministic_ms_p50"]
        row["meets_ms"] = row["stochastic_ms_p50"] <= TARGET_MS
        row["meets_ratio"] = row["ratio_p50"] <= TARGET_RATIO
        results.append(row)
        verdict = f"{'ok' if row['meets_ms'] else 'MISS'} / {'ok' if row['meets_ratio'] else 'MISS'}"
        print(
            f"{name:<28} {row['stochastic_ms_p50']:>10.2f} / {row['stochastic_ms_p95']:<9.2f} "
            f"{row['deterministic_ms_p50']:>12.2f} / {row['deterministic_ms_p95']:<10.2f} "
            f"{row['ratio_p50']:>9.2f}x  {verdict}"
        )
    if cfg.out is not None:
        payload = {
            "benchmark": "controller step latency",
            "threads": cfg.threads,
            "steps": cfg.steps,
            "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(),
            "targets": {"stochastic_ms_p50": TARGET_MS, "ratio_p50": TARGET_RATIO},
            "results": results,
        }
        atomic_write(Path(cfg.out), (json.dumps(payload, indent=2) + "\n").encode())
        print(f"wrote {cfg.out}")
    return 0
