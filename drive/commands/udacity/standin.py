"""`drive udacity standin --replay DIR | --carracing SEED`: the byte-faithful stand-in of the Udacity simulator's
client (sim_bridges/udacity/standin.py) against a running `drive udacity drive` or `drive udacity record` — a real
recording replayed in a loop, or a closed loop over CarRacing — for trying the bridge without Unity."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from drive.errors import UserError
from drive.options import NonNegativeInt, Port, PositiveFloat, PositiveInt


@dataclass(frozen=True)
class Config:
    replay: Path | None = None
    """a recorded driving_log.csv (or its directory), replayed in a loop"""
    carracing: NonNegativeInt | None = None
    """closed loop over CarRacing on this track seed (instead of --replay)"""
    host: str = "127.0.0.1"
    """the bridge's address"""
    port: Port = 4567
    """the bridge's port"""
    max_telemetry: PositiveInt | None = None
    """stop after this many telemetry packets"""
    duration: PositiveFloat | None = None
    """stop after this many seconds"""
    single_chain: bool = False
    """one telemetry on open instead of the simulator's two"""
    malformed_every: NonNegativeInt = 0
    """every k-th telemetry malformed (0: none)"""
    json: Path | None = None
    """write the report here"""


def run(cfg: Config) -> int:
    from sim_bridges.udacity.sources import CarRacingSource, ReplaySource  # OpenCV, socket.io: not for `--help`
    from sim_bridges.udacity.standin import StandIn, StandInConfig

    if (cfg.replay is None) == (cfg.carracing is None):
        raise UserError("give exactly one of --replay DIR and --carracing SEED")
    if not 0 < cfg.port < 65536 or cfg.malformed_every < 0:
        raise UserError(f"--port must be in 1..65535 and --malformed-every >= 0, got {cfg.port}, {cfg.malformed_every}")
    source = (
        ReplaySource(cfg.replay, loop=True)
        if cfg.replay is not None
        else CarRacingSource(cfg.carracing or 0, max_steps=100_000)
    )
    options = StandInConfig(
        cfg.host,
        cfg.port,
        max_telemetry=cfg.max_telemetry,
        duration_s=cfg.duration,
        double_open=not cfg.single_chain,
        malformed_every=cfg.malformed_every,
    )
    report = StandIn(options, source).run()
    summary = {k: v for k, v in asdict(report).items() if k not in ("steer_values", "latencies_s", "raw_answers")}
    summary["latencies_s"] = report.latencies_s
    summary["source"] = getattr(source, "result", {})
    if cfg.json is not None:
        cfg.json.write_text(json.dumps(summary))
    print(f"sent {report.telemetry_sent} telemetry, {report.answers} answers, {len(report.rejected)} rejected")
    return 0
