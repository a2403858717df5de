"""The transport between the Udacity simulator and `UdacityEnv`: a Socket.IO server that answers every frame once.

Socket.IO (python-socketio) with the compatibility layer of `udacity_compat`, served by `kind="threading"`
(werkzeug + simple-websocket, each connection its own OS thread; no monkey-patching) or `kind="eventlet"`
(eventlet.wsgi on green threads in one OS thread of their own; optional dependency), see `udacity_transport`.
Handlers run where the server runs (a connection's reader thread, or the eventlet hub); valid frames wait in a
bounded queue for the env (see `sim_bridges.udacity.bridge` for the answering rules); answers from the env thread are
handed to the server's side by `Transport.call`; `stats` counts everything (connects, answers by kind, refused frames
by reason, client pings).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import socketio

from sim_bridges.udacity.compat import CompatServer
from sim_bridges.udacity.protocol import (
    SAFE_STEER,
    Limits,
    Telemetry,
    TelemetryError,
    is_manual,
    parse_telemetry,
    steer_payload,
)
from sim_bridges.udacity.transport import SERVERS, TransportError, import_eventlet, make_transport

log = logging.getLogger(__name__)
DEFAULT_SERVER = "threading"  # measured with `drive bench udacity --server both`: see docs/udacity.md


@dataclass
class Frame:
    """A valid telemetry frame waiting for (or holding) its one answer."""

    index: int  # count of valid frames this session
    sid: str  # the Socket.IO session to answer
    telemetry: Telemetry
    received_at: float  # time.perf_counter() when it arrived
    coalesced: list[Frame] = field(default_factory=list)  # older waiting frames answered with this one's command


def _check_bindable(host: str, port: int) -> None:
    """Raise OSError naming host:port when the bridge could not listen there (0 picks a free port)."""
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"port {port} is outside 0..65535")
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None


class UdacityServer:
    """Socket.IO server for the simulator: validates and queues telemetry, sends exactly one answer per frame."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 4567,
        *,
        ping_interval: float = 25.0,
        ping_timeout: float = 20.0,
        limits: Limits | None = None,
        max_pending: int = 4,
        max_packet_bytes: int = 16 << 20,
        kind: str = DEFAULT_SERVER,
    ):
        self.host, self.limits, self.max_pending = host, limits or Limits(), max(1, int(max_pending))
        self.stats: Counter[str] = Counter()
        self._cond = threading.Condition()
        self._pending: deque[Frame] = deque()
        self._connected: set[str] = set()
        self._n_frames = 0
        if kind not in SERVERS:
            raise TransportError(f"unknown server {kind!r}; choose one of {', '.join(SERVERS)}")
        if kind == "eventlet":
            import_eventlet()  # before python-socketio looks for it: its import warning stays silenced
        self.kind = kind
        self.sio = CompatServer(
            async_mode=kind,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
            max_http_buffer_size=max_packet_bytes,
            async_handlers=False,  # handlers run in the connection's reader thread: frames stay in order
            logger=False,
            engineio_logger=False,
            on_undecodable=self._on_undecodable,
            on_client_ping=lambda: self._count("client_pings"),
        )
        self.sio.on("connect", self._on_connect)
        self.sio.on("disconnect", self._on_disconnect)
        self.sio.on("telemetry", self._on_telemetry)
        _check_bindable(host, port)  # werkzeug would print to stderr and sys.exit(1) instead of raising
        self._transport = make_transport(kind, host, port, lambda: socketio.WSGIApp(self.sio))
        self.port = self._transport.port
        self.address = tuple(self._transport.address)  # (host, port) the server's socket is bound to
        self._closed = False
        log.info("Udacity bridge (%s) listening on ws://%s:%d/socket.io/", kind, host, self.port)

    # -- handlers (reader threads) ------------------------------------------------------------------------------------
    def _count(self, key: str, n: int = 1) -> None:
        with self._cond:
            self.stats[key] += n

    def _on_connect(self, sid, environ, auth=None):
        with self._cond:
            self._connected.add(sid)
            self.stats["connects"] += 1
            self._cond.notify_all()
        log.info("simulator connected (%s from %s)", sid, environ.get("REMOTE_ADDR"))

    def _on_disconnect(self, sid, reason=None):
        with self._cond:
            self._connected.discard(sid)
            self.stats["disconnects"] += 1
            kept = deque(f for f in self._pending if f.sid != sid)
            self.stats["dropped_on_disconnect"] += len(self._pending) - len(kept)
            self._pending = kept
            self._cond.notify_all()
        log.info("simulator disconnected (%s: %s)", sid, reason)

    def _refuse(self, sid, reason: str, message: str) -> None:
        self._count(f"refused.{reason}")
        log.warning("telemetry from %s refused: %s -> safe steer", sid, message)
        self._send(sid, "steer", dict(SAFE_STEER), "safe")

    def _on_undecodable(self, eio_sid, sid, raw: str) -> None:
        if sid is not None and "telemetry" in raw[:64]:
            self._count("telemetry")
            self._refuse(sid, "undecodable", f"packet does not decode: {raw[:60]!r}")
        else:
            self._count("ignored_packets")

    def _on_telemetry(self, sid, *args):
        self._count("telemetry")
        if len(args) != 1:
            self._refuse(sid, "bad_arguments", f"telemetry with {len(args)} arguments, expected 1")
            return
        data = args[0]
        if is_manual(data):
            self._send(sid, "manual", {}, "manual")
            return
        try:
            telemetry = parse_telemetry(data, self.limits)
        except TelemetryError as exc:
            self._refuse(sid, exc.reason, str(exc))
            return
        flooded = None
        with self._cond:
            closing = self._closed
        if closing:  # nobody will take it: answer now
            self._send(sid, "steer", dict(SAFE_STEER), "safe")
            return
        with self._cond:
            self._n_frames += 1
            self._pending.append(Frame(self._n_frames, sid, telemetry, time.perf_counter()))
            if len(self._pending) > self.max_pending:
                flooded = self._pending.popleft()
            self._cond.notify_all()
        if flooded is not None:
            self._refuse(
                flooded.sid, "flood", f"more than {self.max_pending} frames waiting; dropped frame {flooded.index}"
            )

    # -- the env side ------------------------------------------------------------------------------------------------
    def next_frame(self, timeout: float | None) -> Frame | None:
        """The newest waiting frame (older waiting ones ride along in `.coalesced`), or None after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or self._closed:
                    return None
                self._cond.wait(left)
            frame = self._pending.pop()
            frame.coalesced = list(self._pending)
            self._pending.clear()
            self.stats["coalesced"] += len(frame.coalesced)
            return frame

    def answer(self, frame: Frame, steering: float | None, throttle: float | None = None) -> None:
        """Answer a frame (and those coalesced into it): `steer`, or `manual` when steering is None."""
        if steering is None:
            event, data, kind = "manual", {}, "manual"
        else:
            event, data, kind = "steer", steer_payload(steering, 0.0 if throttle is None else throttle), "steer"
        for f in (*frame.coalesced, frame):
            self._send(f.sid, event, data, kind)

    def answer_safe(self, frame: Frame) -> None:
        for f in (*frame.coalesced, frame):
            self._send(f.sid, "steer", dict(SAFE_STEER), "safe")

    def _send(self, sid, event: str, data: dict, kind: str) -> None:
        with self._cond:
            alive = sid in self._connected
            self.stats[f"answered.{kind}" if alive else "answers_to_closed_sessions"] += 1
        if alive:
            self._transport.call(self.sio.emit, event, data, to=sid)

    @property
    def n_pending(self) -> int:
        with self._cond:
            return len(self._pending)

    @property
    def n_connected(self) -> int:
        with self._cond:
            return len(self._connected)

    def snapshot(self) -> dict[str, int]:
        """The session counters (a copy)."""
        with self._cond:
            out = dict(self.stats)
        out["refused"] = sum(v for k, v in out.items() if k.startswith("refused."))
        return out

    def close(self) -> None:
        """Answer waiting frames (safe steer), disconnect clients, stop serving, join the server thread. Idempotent."""
        if self._closed:
            return
        with self._cond:
            self._closed = True
            sids, waiting = list(self._connected), list(self._pending)
            self._pending.clear()
            self._cond.notify_all()
        for frame in waiting:  # a last answer: throttle 0, the car coasts (frames still in flight die with the link)
            self._send(frame.sid, "steer", dict(SAFE_STEER), "safe")
        for sid in sids:
            try:
                self._transport.call_sync(self.sio.disconnect, sid)
            except Exception as exc:  # a session closing at the same moment
                log.debug("disconnect %s: %s", sid, exc)
        try:
            self._transport.call_sync(self.sio.shutdown)
        except Exception as exc:
            log.debug("shutdown: %s", exc)
        self._transport.close()
