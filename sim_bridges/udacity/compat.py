"""A python-socketio 5 server that speaks to the Udacity simulator's Socket.IO v1-era client.

The simulator's client (Assets/SocketIO/Scripts/SocketIO/SocketIOComponent.cs) opens
`ws://HOST:PORT/socket.io/?EIO=4&transport=websocket` and then differs from a Socket.IO 5 client in two ways:

1. it never sends the Socket.IO CONNECT packet `40`. Stock python-socketio 5 then finds no session for the default
   namespace and drops every event ("... is not connected to namespace /"): the car never moves. python-socketio 4
   connected the default namespace on the engine.io connection itself; so do we (`_handle_eio_connect`), and we
   answer a later explicit CONNECT from a modern client with the existing session instead of CONNECT_ERROR;
2. it sends engine.io pings `2` itself (every 25 s) and waits for a `3`; engine.io 4 servers only ping, never pong,
   and discard a client ping as an unknown packet. We answer them (a per-socket `receive` override).

We also answer a telemetry packet that does not even decode (broken JSON) with the safe steer instead of letting
python-socketio log and drop it: an unanswered frame stalls the simulator for good.

These are private hooks of python-socketio 5.18.1 / python-engineio 4.15.1 (pinned in pyproject.toml; these are the
releases with the 2026 denial-of-service fixes). `check_compat_hooks()` runs when a server is built and raises if an
upgrade moved them; tests/test_udacity_bridge.py checks them too and drives a CONNECT-less client through them.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from importlib.metadata import version

import engineio
import engineio.packet
import engineio.socket
import socketio

log = logging.getLogger(__name__)

PINNED = {"python-socketio": "5.18.1", "python-engineio": "4.15.1"}
# The private methods the layer overrides or calls, with the parameters it relies on.
HOOKS = {
    (socketio.Server, "_handle_eio_connect"): ("eio_sid", "environ"),
    (socketio.Server, "_handle_eio_message"): ("eio_sid", "data"),
    (socketio.Server, "_handle_connect"): ("eio_sid", "namespace", "data"),
    (socketio.Server, "_send_packet"): ("eio_sid", "pkt"),
    (engineio.socket.Socket, "receive"): ("pkt",),
}


class CompatHookError(RuntimeError):
    """The installed python-socketio/python-engineio no longer has the private hooks this layer needs."""


def check_compat_hooks() -> dict[str, str]:
    """Raise CompatHookError if a hook moved; warn if the versions differ from the pins. Returns the versions."""
    found = {name: version(name) for name in PINNED}
    problems = []
    for (cls, name), params in HOOKS.items():
        method = getattr(cls, name, None)
        if not callable(method):
            problems.append(f"{cls.__module__}.{cls.__name__}.{name} is gone")
            continue
        have = tuple(inspect.signature(method).parameters)[1:]
        if have[: len(params)] != params:
            problems.append(f"{cls.__name__}.{name}{have} no longer takes {params}")
    if problems:
        raise CompatHookError(
            f"python-socketio {found['python-socketio']} / python-engineio {found['python-engineio']}: "
            + "; ".join(problems)
            + f". The Udacity bridge is pinned to {PINNED}; reinstall those versions."
        )
    if found != PINNED:
        log.warning("Udacity bridge tested with %s, found %s: run tests/test_udacity_bridge.py", PINNED, found)
    return found


class _PongingSocket(engineio.socket.Socket):
    """An engine.io socket that answers the client's own pings (engine.io 3 behaviour the simulator waits for)."""

    on_client_ping: Callable[[], None] | None = None

    def receive(self, pkt):
        if pkt.packet_type == engineio.packet.PING:
            self.send(engineio.packet.Packet(engineio.packet.PONG, data=pkt.data))
            if self.on_client_ping is not None:
                self.on_client_ping()
            return
        super().receive(pkt)


class CompatServer(socketio.Server):
    """socketio.Server that auto-connects the default namespace and answers client pings and broken telemetry.

    `on_undecodable(eio_sid, sid, raw)` is called for a text packet that python-socketio cannot decode; the bridge
    answers it. `on_client_ping()` counts pings from clients.
    """

    def __init__(self, *args, on_undecodable=None, on_client_ping=None, **kwargs):
        check_compat_hooks()
        super().__init__(*args, **kwargs)
        self._on_undecodable = on_undecodable
        self._on_client_ping = on_client_ping

    def _handle_eio_connect(self, eio_sid, environ):
        super()._handle_eio_connect(eio_sid, environ)
        sock = self.eio.sockets.get(eio_sid)
        if sock is None:
            raise CompatHookError(f"engineio.Server.sockets has no socket {eio_sid} at connect time")
        sock.__class__ = _PongingSocket
        sock.on_client_ping = self._on_client_ping
        # What python-socketio 4 did: connect "/" as soon as engine.io connects (sends `40{"sid":...}`, which the
        # simulator's decoder reads as a CONNECT packet and ignores).
        self._handle_connect(eio_sid, "/", None)

    def _handle_connect(self, eio_sid, namespace, data):
        namespace = namespace or "/"
        sid = self.manager.sid_from_eio_sid(eio_sid, namespace)
        if sid is not None and self.manager.is_connected(sid, namespace):
            # A client that does send CONNECT after our automatic one: confirm the session it already has.
            self._send_packet(eio_sid, self.packet_class(socketio.packet.CONNECT, {"sid": sid}, namespace=namespace))
            return
        super()._handle_connect(eio_sid, namespace, data)

    def _handle_eio_message(self, eio_sid, data):
        try:
            super()._handle_eio_message(eio_sid, data)
        except Exception as exc:  # broken JSON, unknown packet type, a binary packet we never asked for
            raw = data if isinstance(data, str) else "<binary>"
            sid = self.manager.sid_from_eio_sid(eio_sid, "/")
            log.warning("undecodable packet from %s (%s: %s): %.80r", sid, type(exc).__name__, exc, raw)
            if self._on_undecodable is not None:
                self._on_undecodable(eio_sid, sid, raw)
