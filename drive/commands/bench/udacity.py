"""`drive bench udacity`: the telemetry -> steer round trip through the bridge with a controller, p50/p95.

What is timed: the stand-in (`drive udacity standin`, a separate process, as the simulator is)
replays real frames from a recorded driving_log.csv; for each telemetry packet it sends, it records the time until
the `steer` answering it arrives. In between: websocket + engine.io + Socket.IO (python-socketio threading mode, the
server we ship), JSON, base64, JPEG decode and validation, `datasets.udacity.preprocess`, the controller's
`predict(x, S)` and the speed controller, the answer's encoding. Run twice: with one answer chain (the pure round
trip) and with the simulator's two chains (each frame may also wait behind the other chain's frame). The
controller alone (preprocess + predict, in-process) is timed too. Target: single-chain p95 < 30 ms with S = 16.
Default controller: the shipped checkpoints/udacity_nsac.pt; `--checkpoint ''` measures an untrained NSAC from
agents.registry with the nvidia encoder (its latency is that of a trained one).
`--server threading|eventlet|both` (default both): the bridge's two servers (sim_bridges/udacity/transport.py), run
one after the other on the same frames, with their ratio; the faster one at p95 is the bridge's default.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from datasets.root import REPO, data_root
from drive.errors import UserError
from drive.loop.options import DEFAULT_SERVER, SpeedConfig
from drive.options import NonNegativeInt, PositiveInt


@dataclass(frozen=True)
class Config:
    checkpoint: str = "checkpoints/udacity_nsac.pt"
    """a trained controller checkpoint (default: the shipped Udacity NSAC); '' measures an untrained controller"""
    controller: str = "nsac"
    """registry name of the untrained controller"""
    d_model: PositiveInt = 32
    """token width of the untrained controller's nvidia encoder (the udacity task's width)"""
    samples: PositiveInt = 16
    """stochastic samples per prediction (S)"""
    frames: PositiveInt = 300
    """timed round trips per run"""
    warmup: NonNegativeInt = 30
    """round trips discarded first"""
    data: str = ""
    """driving_log.csv (or its directory) to replay (default: udacity_sim in $DRIVE_DATA_ROOT or ../shared/data)"""
    threads: PositiveInt = 1
    """torch CPU threads"""
    out: str = ""
    """write the results as JSON here"""
    seed: int = 0
    """seed of the model's initialisation and sampling"""
    server: Literal["threading", "eventlet", "both"] = "both"
    """the bridge's server(s) to measure (eventlet: optional, pip install eventlet==0.41.3)"""


def _data_dir(cfg: Config) -> Path:
    return Path(cfg.data) if cfg.data else data_root() / "udacity_sim"


def _model(cfg: Config):
    import torch

    from agents.encoders import EncoderConfig
    from agents.registry import CONTROLLERS, build_controller
    from drive.checkpoint import load_controller

    if cfg.checkpoint:
        path = Path(cfg.checkpoint)
        if not path.is_absolute() and not path.exists():  # the shipped default, run from outside the checkout
            path = REPO / path
        return load_controller(path)[0], str(cfg.checkpoint)
    torch.manual_seed(cfg.seed)
    mcfg = CONTROLLERS[cfg.controller](encoder=EncoderConfig(kind="nvidia", d_model=cfg.d_model))
    name = f"untrained {cfg.controller} (nvidia encoder, d={cfg.d_model})"
    return build_controller(cfg.controller, mcfg).eval(), name


def _pct(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms, dtype=np.float64)
    return {
        "n": int(a.size),
        "p50_ms": float(np.percentile(a, 50)),
        "p95_ms": float(np.percentile(a, 95)),
        "mean_ms": float(a.mean()),
    }


def _round_trips(cfg: Config, policy, data: Path, single_chain: bool, server: str) -> dict:
    from sim_bridges.udacity.bridge import UdacityEnv

    env = UdacityEnv(port=0, timeout_s=3.0, connect_timeout_s=30.0, kind=server)
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "standin.json"
        cmd = [
            sys.executable,
            "-m",
            "drive",
            "udacity",
            "standin",
            "--replay",
            str(data),
            "--json",
            str(report_path),
            "--port",
            str(env.server.port),
            "--max-telemetry",
            str(cfg.frames + cfg.warmup),
        ]
        standin = subprocess.Popen(cmd + (["--single-chain"] if single_chain else []), stdout=subprocess.DEVNULL)
        try:
            obs, info = env.reset()
            policy.reset()
            server_ms = []
            while True:
                out = policy.act(obs, info)
                server_ms.append(out.latency_ms)
                obs, _, _, truncated, info = env.step(out.action)
                if truncated:
                    break
            standin.wait(timeout=30)
        finally:
            if standin.poll() is None:
                standin.kill()
            stats = env.server.snapshot()
            env.close()
        report = json.loads(report_path.read_text())
    rt = [1e3 * s for s in report["latencies_s"][cfg.warmup :]]
    return {
        "round_trip": _pct(rt),
        "controller_in_loop": _pct(server_ms[cfg.warmup :]),
        "answers": report["steer_answers"],
        "sent": report["telemetry_sent"],
        "rejected": len(report["rejected"]),
        "refused": stats["refused"],
        "coalesced": stats.get("coalesced", 0),
    }


def _print(console, results: dict) -> None:
    from rich.table import Table

    table = Table("what", "n", "p50 ms", "p95 ms", "mean ms")
    rows = [("controller alone (preprocess + predict)", results["controller_alone"])]
    for server, r in results["servers"].items():
        rows += [
            (f"{server}: round trip, one chain", r["single_chain"]["round_trip"]),
            (f"{server}:   controller inside it", r["single_chain"]["controller_in_loop"]),
            (f"{server}: round trip, two chains", r["two_chains"]["round_trip"]),
        ]
    for label, r in rows:
        table.add_row(label, str(r["n"]), f"{r['p50_ms']:.2f}", f"{r['p95_ms']:.2f}", f"{r['mean_ms']:.2f}")
    console.print(table)
    p95 = {s: r["single_chain"]["round_trip"]["p95_ms"] for s, r in results["servers"].items()}
    for server, r in results["servers"].items():
        verdict = "meets" if p95[server] < 30 else "MISSES"
        counts = ", ".join(
            f"{k}: {r[k]['sent']} sent, {r[k]['answers']} answered, {r[k]['rejected']} rejected, "
            f"{r[k]['refused']} refused"
            for k in ("single_chain", "two_chains")
        )
        console.print(f"{server}: single-chain round trip p95 {p95[server]:.1f} ms {verdict} the 30 ms target")
        console.print(f"  {counts}")
    if len(p95) == 2:
        best = min(p95, key=p95.__getitem__)
        results["faster_server"] = best
        results["p95_ratio_eventlet_to_threading"] = p95["eventlet"] / p95["threading"]
        console.print(
            f"p95 eventlet / threading = {results['p95_ratio_eventlet_to_threading']:.2f}: {best} is faster"
            f"; the bridge's default is {results['default_server']}"
        )


def run(cfg: Config) -> int:
    # the engine, imported when the command runs: `drive bench udacity --help` must not load torch or socket.io
    import torch
    from rich.console import Console

    from drive.loop.udacity import SpeedController, SteeringPolicy
    from sim_bridges.udacity.protocol import decode_jpeg
    from sim_bridges.udacity.sources import read_driving_log
    from sim_bridges.udacity.transport import TransportError, import_eventlet

    torch.set_num_threads(cfg.threads)
    data = _data_dir(cfg)
    rows = read_driving_log(data)  # fails with the path if the data is not there
    model, name = _model(cfg)
    policy = SteeringPolicy(model, cfg.samples, cfg.seed, SpeedController(SpeedConfig()))
    console = Console()
    console.print(f"[bold]drive bench udacity[/]: {name}, S = {cfg.samples}, {cfg.frames} frames from {data}")
    frames = [decode_jpeg(p.read_bytes()) for p, *_ in rows[: cfg.frames + cfg.warmup]]
    alone = []
    for i, rgb in enumerate(frames):
        t0 = time.perf_counter()
        policy.predict(rgb)
        if i >= cfg.warmup:
            alone.append(1e3 * (time.perf_counter() - t0))
    servers = ["threading", "eventlet"] if cfg.server == "both" else [cfg.server]
    if "eventlet" in servers:
        try:
            import_eventlet()
        except TransportError as exc:
            raise UserError(str(exc)) from None
    results = {
        "controller": name,
        "n_samples": cfg.samples,
        "threads": cfg.threads,
        "controller_alone": _pct(alone),
        "servers": {},
        "default_server": DEFAULT_SERVER,
    }
    for server in servers:
        runs = results["servers"][server] = {}
        with console.status(f"{server}: round trips, one chain ..."):
            runs["single_chain"] = _round_trips(cfg, policy, data, True, server)
        with console.status(f"{server}: round trips, two chains (as the simulator) ..."):
            runs["two_chains"] = _round_trips(cfg, policy, data, False, server)
    _print(console, results)
    if cfg.out:
        Path(cfg.out).write_text(json.dumps(results, indent=2))
    return 0
