"""`drive udacity drive`: drive the Udacity simulator (or its stand-in) over socket.io with a policy.

Start the simulator, choose Autonomous Mode; it connects to ws://HOST:PORT. The policies and the speed controller
are drive/loop/udacity.py. Every step is logged (steps.csv flushed per row, steps.parquet at the end), the
overlay is shown (or written to overlay.mp4 when headless), the session's counters (answers, refused frames by
reason) land in session.json.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from tqdm import tqdm

from datasets.root import portable
from drive.errors import UserError
from drive.loop.options import BridgeOptions, SpeedConfig
from drive.options import NonNegativeInt, PositiveFloat, PositiveInt


@dataclass(frozen=True)
class Config(SpeedConfig, BridgeOptions):
    ckpt: Path | None = None
    """a controller trained on Udacity frames (`drive train --data udacity:DIR`) that drives"""
    driver: Literal["vision", "vision:carracing"] = "vision"
    """without --ckpt: vision (a road follower on the simulator's camera) or vision:carracing (on the stand-in's)"""
    samples: PositiveInt = 16
    """--ckpt: stochastic samples per prediction (S)"""
    episodes: PositiveInt = 1
    """episodes to drive; an episode ends after max_steps or when no frame comes for timeout_s"""
    max_steps: NonNegativeInt = 0
    """steps per episode (0 = until the simulator stops sending)"""
    timeout_s: PositiveFloat = 5.0
    """seconds to wait for the next frame before ending the episode"""
    display: Literal["auto", "window", "video", "none"] = "auto"
    """overlay: a window, an mp4 in the run directory, or none (auto: window when a display exists)"""
    run_dir: str = ""
    """where logs go (default runs/udacity_drive/<timestamp>)"""
    seed: NonNegativeInt = 0
    """seed of the controller's sampling generator"""
    threads: PositiveInt = 1
    """torch CPU threads"""


def run(cfg: Config) -> int:
    import torch  # the engine, imported when the command runs: not for `--help` (drive/cli.py)
    from gymnasium.wrappers import TimeLimit

    from drive.loop.rollout import Observer, rollout
    from drive.loop.udacity import checked_server, make_policy
    from drive.observe.udacity import Overlay, StepLog, StopDriving
    from sim_bridges.udacity.bridge import UdacityEnv

    tqdm.monitor_interval = 0  # no monitor thread: the loop updates its bar itself
    torch.set_num_threads(cfg.threads)
    policy = make_policy(f"ckpt:{cfg.ckpt}" if cfg.ckpt else cfg.driver, cfg, cfg.samples, cfg.seed)  # pre-bind
    run_dir = Path(cfg.run_dir or f"runs/udacity_drive/{time.strftime('%Y%m%d-%H%M%S')}")
    if (run_dir / "steps.csv").exists():
        raise UserError(f"--run-dir {run_dir} holds another session's log: each session logs into a new directory")
    created = not run_dir.exists()
    env = UdacityEnv(
        cfg.host,
        cfg.port,
        timeout_s=cfg.timeout_s,
        connect_timeout_s=cfg.connect_timeout_s,
        ping_interval=cfg.ping_interval_s,
        kind=checked_server(cfg.server),
    )
    print(f"listening on ws://{cfg.host}:{env.server.port}/socket.io/ -- start the simulator in Autonomous Mode")
    run_dir.mkdir(parents=True, exist_ok=True)  # after the port is bound: a refused port leaves nothing behind
    (run_dir / "config.json").write_text(json.dumps(portable(dataclasses.asdict(cfg)), indent=2, default=str))
    print(f"logging to {run_dir}", flush=True)
    steps = StepLog(run_dir)
    bar = tqdm(desc="frames", unit="frame", mininterval=1.0, delay=0.5)  # shown once frames come
    observers: list[Observer] = [steps, lambda rec: bar.update(1)]
    overlay = None if cfg.display == "none" else Overlay(cfg.display, run_dir / "overlay.mp4")
    observers += [overlay] if overlay else []
    wrapped = TimeLimit(env, cfg.max_steps) if cfg.max_steps > 0 else env
    results, code, never_came = [], 0, ""
    try:
        results = rollout(wrapped, policy, seeds=range(cfg.seed, cfg.seed + cfg.episodes), on_step=observers)
    except TimeoutError as exc:
        if not steps.latencies_ms:  # the simulator never came: nothing to keep, the fix is to start it
            never_came = str(exc)
        else:
            print(f"drive udacity drive: {exc} (the log so far is kept)")
            code = 1
    except (KeyboardInterrupt, StopDriving):
        print("stopped")
    finally:
        stats = env.server.snapshot()
        _close(bar, env, steps, overlay)
    if never_came:  # what this session wrote goes; a directory the user gave stays
        for name in ("config.json", "steps.csv", "steps.parquet", "overlay.mp4"):
            (run_dir / name).unlink(missing_ok=True)
        if created and not any(run_dir.iterdir()):
            run_dir.rmdir()
        raise UserError(never_came)
    lat = np.array([x for x in steps.latencies_ms if math.isfinite(x)])
    latency_ms: dict[str, float] = {}
    if lat.size:
        latency_ms = {"p50": float(np.percentile(lat, 50)), "p95": float(np.percentile(lat, 95))}
    session = {"server": stats, "episodes": [r.to_dict() for r in results], "policy_latency_ms": latency_ms}
    (run_dir / "session.json").write_text(json.dumps(session, indent=2))
    print(
        f"{len(lat)} steps; answers {stats.get('answered.steer', 0)} steer, {stats.get('answered.manual', 0)} "
        f"manual, {stats.get('answered.safe', 0)} safe; refused {stats['refused']}; "
        f"policy p50/p95 {latency_ms.get('p50', math.nan):.1f}/{latency_ms.get('p95', math.nan):.1f} ms"
    )
    if overlay and overlay.mode == "video" and overlay.n_frames:
        print(f"overlay video: {run_dir / 'overlay.mp4'}")
    return code


def _close(*things) -> None:
    """Close the bar, the bridge, the step log and the overlay (each once; closing twice is harmless)."""
    for thing in things:
        if thing is not None:
            thing.close()
