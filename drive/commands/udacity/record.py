"""`drive udacity record --out DIR`: record every telemetry frame, and the command sent for it, as the simulator would.

Output: DIR/driving_log.csv in the simulator's own format (no header; `center, left, right, steering, throttle,
brake, speed` separated by ", "; absolute image paths) and DIR/IMG/center_YYYY_MM_DD_HH_MM_SS_mmm.jpg -- the JPEG
bytes exactly as received. Only the center camera travels over the protocol, so `left` and `right` are empty.
steering/throttle/brake are the command answered for that frame (`--driver`, `--ckpt`); with `--driver manual`
(the default: whoever drives the simulator drives) they are the car's own, read from the telemetry.

Nothing already received is lost to a disconnect or a kill: each frame's image is written to a temporary file,
fsynced and renamed into IMG/, then its csv row is appended with a single write() and fsynced -- all before the
frame is answered. A killed recorder leaves at most the frame it was writing half done (a stray *.tmp), never a
partial row. Refused frames (bad base64, corrupt JPEG, ...) are answered with the safe steer and counted in
session.json, not recorded. An existing DIR is appended to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from drive.loop.options import BridgeOptions, SpeedConfig
from drive.options import NonNegativeFloat, NonNegativeInt, PositiveFloat


@dataclass(frozen=True)
class Config(BridgeOptions):
    out: str = field(kw_only=True)
    """directory for driving_log.csv and IMG/ (appended to if it exists)"""
    driver: Literal["manual", "vision", "vision:carracing"] = "manual"
    """manual (answer `manual`: the simulator's driver drives), vision (a road follower on the simulator's camera)
    or vision:carracing (on the stand-in's); --ckpt drives instead"""
    ckpt: Path | None = None
    """a controller trained on Udacity frames that drives (instead of --driver)"""
    target_speed_mph: PositiveFloat = 20.0
    """speed target of a driving policy"""
    max_frames: NonNegativeInt = 0
    """stop after recording this many frames (0 = until stopped)"""
    idle_timeout_s: NonNegativeFloat = 60.0
    """stop when no frame comes for this long (0 = wait forever)"""


def run(cfg: Config) -> int:
    # the engine, imported when the command runs: `drive udacity record --help` must not load torch or socket.io
    from tqdm import tqdm

    from drive.loop.udacity import checked_server, make_policy
    from drive.observe.driving_log import DrivingLogWriter
    from sim_bridges.udacity.bridge import UdacityServer

    tqdm.monitor_interval = 0  # no monitor thread: the loop updates its bar itself
    policy = None
    if cfg.ckpt is not None or cfg.driver != "manual":
        spec = f"ckpt:{cfg.ckpt}" if cfg.ckpt is not None else cfg.driver
        policy = make_policy(spec, SpeedConfig(target_speed_mph=cfg.target_speed_mph))
        policy.reset()
    writer = DrivingLogWriter(cfg.out)
    server = UdacityServer(cfg.host, cfg.port, ping_interval=cfg.ping_interval_s, kind=checked_server(cfg.server))
    print(f"listening on ws://{cfg.host}:{server.port}/socket.io/ -- recording into {writer.dir}", flush=True)
    bar = tqdm(desc="recorded", unit="frame", mininterval=1.0)
    timeout = cfg.connect_timeout_s
    try:
        while cfg.max_frames <= 0 or writer.n_frames < cfg.max_frames:
            frame = server.next_frame(timeout if timeout > 0 else None)
            if frame is None:
                print(f"no frame for {timeout:.0f} s: stopping")
                break
            timeout = cfg.idle_timeout_s
            steering: float | None = None  # manual: the car's own controls, as the telemetry reports them
            throttle: float | None = None
            if policy is not None:
                t = frame.telemetry
                out = policy.act({"image": t.image, "speed": np.array([t.speed_mph], np.float32)}, {})
                steering, throttle = float(out.action[0]), float(out.action[1])
            for f in (*frame.coalesced, frame):  # every received frame is recorded before it is answered
                t = f.telemetry
                s, th = (t.steering, t.throttle) if steering is None or throttle is None else (steering, throttle)
                writer.write(t.jpeg, s, max(th, 0.0), max(-th, 0.0), t.speed_mph)
            server.answer(frame, steering, throttle)
            bar.update(1 + len(frame.coalesced))
    except KeyboardInterrupt:
        print("stopped")
    finally:
        bar.close()
        stats = server.snapshot()
        server.close()
        writer.close()
    stats["recorded"] = writer.n_frames
    (writer.dir / "session.json").write_text(json.dumps(stats, indent=2))
    refused = {k[8:]: v for k, v in stats.items() if k.startswith("refused.")}
    print(f"recorded {writer.n_frames} frames into {writer.dir}; refused {stats['refused']} {refused or ''}")
    return 0 if writer.n_frames else 1
