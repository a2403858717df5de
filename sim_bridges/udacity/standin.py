"""A stand-in for the Udacity simulator's client, byte for byte on the wire, for tests and benchmarks.

It imitates Assets/SocketIO/Scripts/SocketIO/SocketIOComponent.cs + CommandServer.cs of udacity/self-driving-car-sim:
- a raw websocket to `ws://HOST:PORT/socket.io/?EIO=4&transport=websocket`; never sends the Socket.IO CONNECT `40`
  (unless `send_connect`, to test modern clients);
- telemetry on websocket open and again on the engine.io open packet `0{...}` (two answer chains), then strictly one
  telemetry per `steer` or `manual` it receives: `42["telemetry",{"steering_angle":"-1.2345","throttle":"0.0000",
  "speed":"12.3456","image":"<base64 JPEG>"}]`, fields in that order, C# N4 strings, no spaces;
- `steer` is read like `float.Parse(json.GetField(name).str)`: a missing field, a JSON number or text float.Parse
  refuses throws in the simulator, no telemetry follows and that chain is dead -- counted in `rejected`;
- its own engine.io pings `2` every `ping_interval` (first one at connect), waiting for `3` in 200 ms sleeps; the
  simulator's wait compares seconds with milliseconds, so it waits ~pingTimeout*1000 s -- faithfully kept; it answers
  server pings `2` with `3`; on close it sends `41` then `1`; after a dropped connection it reconnects.

Frame sources live in `udacity_sources`: `ReplaySource` (a recorded driving_log.csv) and `CarRacingSource` (closed loop
over CarRacing); a source has `telemetry() -> fields`, `apply(steering, throttle)`, `done` and `reference_jpeg()`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import simple_websocket

from sim_bridges.udacity.protocol import csharp_float_parse, decode_packet, telemetry_packet
from sim_bridges.udacity.sources import malformed_packet

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StandInConfig:
    host: str = "127.0.0.1"
    port: int = 4567
    ping_interval: float = 25.0
    """seconds between the client's own pings (SocketIOComponent.pingInterval)"""
    ping_poll: float = 0.2
    """the client's sleep while it waits for a pong"""
    double_open: bool = True
    """telemetry on websocket open AND on engine.io open, as the simulator (False: one chain, for latency)"""
    send_connect: bool = False
    """send a Socket.IO CONNECT `40` after opening, as a modern client does (the simulator never does)"""
    reconnect: bool = True
    """reconnect after the connection drops, as RunSocketThread does"""
    max_telemetry: int | None = None
    """stop after sending this many telemetry packets (None: until the source is done)"""
    duration_s: float | None = None
    """stop after this many seconds"""
    malformed_every: int = 0
    """replace every k-th telemetry by a malformed one, cycling through MALFORMED_KINDS (0: never)"""
    empty_every: int = 0
    """send every k-th telemetry empty, as while a person drives (0: never)"""
    drain_timeout_s: float = 5.0
    """after stopping, how long to wait for the answers still owed"""


@dataclass
class StandInReport:
    telemetry_sent: int = 0
    empty_sent: int = 0
    malformed_sent: Counter = field(default_factory=Counter)
    extra_sent: int = 0  # frames pushed beyond the protocol (floods)
    steer_answers: int = 0
    manual_answers: int = 0
    rejected: list[str] = field(default_factory=list)  # answers the simulator would throw on
    out_of_range: int = 0  # parsed steer values outside [-1, 1]
    unsolicited: int = 0  # answers with no telemetry outstanding
    steer_values: list[tuple[float, float]] = field(default_factory=list)
    raw_answers: list[str] = field(default_factory=list)  # the first 20 answer packets, verbatim
    pings_sent: int = 0
    pongs_received: int = 0
    server_pings: int = 0
    connects: int = 0
    connect_acks: int = 0  # `40...` packets received
    latencies_s: list[float] = field(default_factory=list)  # telemetry sent -> next answer received
    outstanding: int = 0

    @property
    def answers(self) -> int:
        return self.steer_answers + self.manual_answers


class StandIn:
    """Run with `run()` (blocking) or `start()` + `join()`; the report fills in as it goes."""

    def __init__(self, cfg: StandInConfig, source):
        self.cfg, self.source = cfg, source
        self.report = StandInReport()
        self.url = f"ws://{cfg.host}:{cfg.port}/socket.io/?EIO=4&transport=websocket"
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._ws: simple_websocket.Client | None = None
        self._stop = threading.Event()
        self._pong = threading.Event()
        self._sent_at: list[float] = []
        self._thread: threading.Thread | None = None
        self._n_emits = 0

    # -- sending -----------------------------------------------------------------------------------------------------
    def _send(self, text: str) -> bool:
        ws = self._ws
        try:
            with self._send_lock:  # websocket-sharp serialises sends too: a ping never splits a frame
                if ws is None or not ws.connected:
                    return False
                ws.send(text)
            return True
        except (simple_websocket.ConnectionClosed, OSError):
            return False

    def _stopping(self) -> bool:
        r, cfg = self.report, self.cfg
        return (
            self._stop.is_set()
            or getattr(self.source, "done", False)
            or (cfg.max_telemetry is not None and r.telemetry_sent >= cfg.max_telemetry)
            or (cfg.duration_s is not None and time.monotonic() - self._t0 >= cfg.duration_s)
        )

    def emit_telemetry(self) -> None:
        """EmitTelemetry: one telemetry packet (unless stopping)."""
        with self._lock:
            if self._stopping():
                return
            self._n_emits += 1
            k, cfg = self._n_emits, self.cfg
            if cfg.malformed_every and k % cfg.malformed_every == 0:
                kind, text = malformed_packet(self.report.malformed_sent.total(), self.source.reference_jpeg())
                self.report.malformed_sent[kind] += 1
            elif cfg.empty_every and k % cfg.empty_every == 0:
                text = telemetry_packet(None)
                self.report.empty_sent += 1
            else:
                text = telemetry_packet(self.source.telemetry())
            if self._send(text):
                self.report.telemetry_sent += 1
                self.report.outstanding += 1
                self._sent_at.append(time.perf_counter())

    def flood(self, n: int) -> None:
        """Push n extra telemetry frames at once, beyond one-per-answer (what a misbehaving client does)."""
        for _ in range(n):
            with self._lock:
                if self._send(telemetry_packet(self.source.telemetry())):
                    self.report.telemetry_sent += 1
                    self.report.extra_sent += 1
                    self.report.outstanding += 1
                    self._sent_at.append(time.perf_counter())

    # -- receiving ---------------------------------------------------------------------------------------------------
    def _on_answer(self, name: str, data, raw: str) -> None:
        r = self.report
        with self._lock:
            if len(r.raw_answers) < 20:
                r.raw_answers.append(raw)
            if r.outstanding <= 0:
                r.unsolicited += 1
            else:
                r.outstanding -= 1
                r.latencies_s.append(time.perf_counter() - self._sent_at.pop(0))
        if name == "manual":  # onManual: EmitTelemetry
            r.manual_answers += 1
            self.emit_telemetry()
            return
        try:  # OnSteer: float.Parse(jsonObject.GetField("steering_angle").str) ...
            if not isinstance(data, dict):
                raise TypeError("steer data is not an object")
            steering = csharp_float_parse(data.get("steering_angle"))
            throttle = csharp_float_parse(data.get("throttle"))
        except (TypeError, ValueError) as exc:
            r.rejected.append(f"{exc}: {raw[:80]}")
            return  # the exception escapes OnSteer: no telemetry, this chain is dead
        r.steer_answers += 1
        r.steer_values.append((steering, throttle))
        if not (-1.0 <= steering <= 1.0 and -1.0 <= throttle <= 1.0):
            r.out_of_range += 1
        self.source.apply(min(max(steering, -1.0), 1.0), min(max(throttle, -1.0), 1.0))
        self.emit_telemetry()

    def _on_message(self, text: str) -> None:
        try:
            engine, socket_type, payload = decode_packet(text)
        except (ValueError, IndexError) as exc:
            log.debug("stand-in cannot decode %r: %s", text[:60], exc)
            return
        if engine == 0:  # HandleOpen -> EmitEvent("open") -> OnOpen -> EmitTelemetry
            self.emit_telemetry()
        elif engine == 2:  # HandlePing
            self.report.server_pings += 1
            self._send("3")
        elif engine == 3:  # HandlePong
            self.report.pongs_received += 1
            self._pong.set()
        elif engine == 4 and socket_type == 0:
            self.report.connect_acks += 1
        elif engine == 4 and socket_type == 2 and isinstance(payload, list) and payload:
            if payload[0] in ("steer", "manual"):
                self._on_answer(payload[0], payload[1] if len(payload) > 1 else None, text)

    def _ping_loop(self) -> None:
        while not self._stop.is_set():
            ws = self._ws
            if ws is None or not ws.connected:
                self._stop.wait(0.005)
                continue
            self._pong.clear()
            if self._send("2"):
                self.report.pings_sent += 1
            start = time.monotonic()
            # SocketIOComponent.RunPingThread compares TotalSeconds with timeoutMilis: kept as written.
            while ws.connected and not self._pong.is_set() and time.monotonic() - start < 60.0 * 1000:
                if self._stop.wait(self.cfg.ping_poll):
                    return
            self._stop.wait(self.cfg.ping_interval)

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def run(self) -> StandInReport:
        self._t0 = time.monotonic()
        pinger = threading.Thread(target=self._ping_loop, name="standin-ping", daemon=True)
        pinger.start()
        try:
            while not self._stop.is_set():
                try:
                    self._ws = simple_websocket.Client.connect(self.url)
                except (ConnectionError, OSError) as exc:
                    log.debug("stand-in connect failed: %s", exc)
                    if not self.cfg.reconnect or self._stop.wait(0.05):
                        break
                    continue
                self.report.connects += 1
                with self._lock:  # answers owed on a dead connection never come
                    self.report.outstanding, self._sent_at = 0, []
                if self.cfg.double_open:
                    self.emit_telemetry()  # ws.OnOpen -> EmitEvent("open") -> OnOpen -> EmitTelemetry
                if self.cfg.send_connect:
                    self._send("40")
                self._read_until_done()
                if not self.cfg.reconnect or self._stopping():
                    break
        finally:
            self._stop.set()
            pinger.join(timeout=2)
            self._close()
        return self.report

    def _read_until_done(self) -> None:
        drain_deadline = None
        while self._ws is not None and self._ws.connected and not self._stop.is_set():
            if self._stopping():
                if self.report.outstanding <= 0:
                    return
                drain_deadline = drain_deadline or time.monotonic() + self.cfg.drain_timeout_s
                if time.monotonic() > drain_deadline:
                    return
            try:
                text = self._ws.receive(timeout=0.05)
            except simple_websocket.ConnectionClosed:
                return
            if isinstance(text, str) and text:
                self._on_message(text)

    def _close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None and ws.connected:
            for packet in ("41", "1"):  # SocketIOComponent.EmitClose
                try:
                    ws.send(packet)
                except (simple_websocket.ConnectionClosed, OSError):
                    break
            try:
                ws.close()
            except (simple_websocket.ConnectionClosed, OSError):
                pass

    def drop_connection(self) -> None:
        """Kill the socket without the close handshake (a crash or network loss); the run loop reconnects."""
        ws = self._ws
        if ws is not None:
            try:
                ws.sock.close()
            except OSError:
                pass

    def start(self) -> StandIn:
        self._thread = threading.Thread(target=self.run, name="standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    @property
    def alive(self) -> bool:
        """Still running (started with `start()`)."""
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> StandInReport:
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"stand-in still running after {timeout} s")
        return self.report
