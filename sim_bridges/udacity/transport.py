"""The HTTP/websocket servers the Udacity bridge can run its Socket.IO app on: `threading` or `eventlet`.

- `threading` (python-socketio's threading mode): werkzeug's threaded WSGI server with simple-websocket; each
  connection has its own OS thread. No extra dependency, no monkey-patching.
- `eventlet` (what the classic Udacity `drive.py` used): `eventlet.wsgi` on green threads, all in one OS thread of
  its own with its own hub (nothing is monkey-patched: the rest of the process, torch and the env included, runs
  on ordinary threads). Green code is not thread-safe, so whatever the env thread asks of the Socket.IO server
  (emit, disconnect, shutdown) is handed to the hub through a deque and a socketpair wake-up, in order, and runs
  there. eventlet's websocket unmasks every client frame byte by byte in Python (`RFC6455WebSocket._apply_mask`:
  ~12 ms for one 20-30 kB telemetry frame, measured send -> handler p50 12.6 ms against 0.39 ms for threading);
  `import_eventlet` replaces it by the same XOR done on whole integers (checked equal to the original on a sample at
  every start, and in tests/sim_bridges). Optional: `pip install eventlet==0.41.3` (the release this was measured
  with). eventlet is in
  maintenance mode upstream and warns on import (EventletDeprecationWarning); that warning is silenced here, only
  for its import, so it never reaches the user of `drive udacity drive --server eventlet`.

`Transport.call(fn, *args)` runs fn where the Socket.IO server lives (at once for threading, on the hub for
eventlet); `call_sync` also waits for its result. `close()` stops serving and joins the server's thread.
"""

from __future__ import annotations

import concurrent.futures
import logging
import socket
import threading
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

SERVERS = ("threading", "eventlet")
EVENTLET_PIN = "eventlet==0.41.3"


class TransportError(RuntimeError):
    """The chosen server cannot run (eventlet not installed)."""


def import_eventlet():
    """eventlet and eventlet.wsgi, its deprecation warning kept out of the user's way; TransportError if absent."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # EventletDeprecationWarning, a plain Warning subclass, on first import
            import eventlet
            import eventlet.greenio
            import eventlet.websocket
            import eventlet.wsgi
    except ImportError:
        raise TransportError(f"--server eventlet needs eventlet: pip install {EVENTLET_PIN}") from None
    ws = eventlet.websocket.RFC6455WebSocket
    if ws.__dict__["_apply_mask"].__func__ is not fast_apply_mask:
        original = ws._apply_mask
        sample = bytes(range(256)) * 3
        for offset, length in ((0, None), (3, 101), (6, 767)):
            if fast_apply_mask(sample, (1, 77, 200, 9), length, offset) != original(
                sample, (1, 77, 200, 9), length, offset
            ):
                raise TransportError("eventlet's websocket unmasking changed: cannot use the fast path")
        ws._apply_mask = staticmethod(fast_apply_mask)
    return eventlet


def fast_apply_mask(data: bytes, mask, length: int | None = None, offset: int = 0) -> bytes:
    """eventlet's RFC6455WebSocket._apply_mask (XOR of data[:length] with the 4-byte mask from `offset`), whole-int."""
    length = len(data) if length is None else length
    key = bytes(mask[(offset + i) % 4] for i in range(4)) * (length // 4 + 1)
    value = int.from_bytes(data[:length], "little") ^ int.from_bytes(key[:length], "little")
    return value.to_bytes(length, "little")


class ThreadingTransport:
    """werkzeug's threaded server, serving in a daemon thread."""

    async_mode = "threading"

    def __init__(self, host: str, port: int, app_factory: Callable[[], Any]):
        from werkzeug.serving import WSGIRequestHandler, make_server

        class _Quiet(WSGIRequestHandler):
            def log(self, type, message, *args):  # noqa: A002 - werkzeug's signature
                log.debug("http: " + message, *args)

        self._httpd = make_server(host, port, app_factory(), threaded=True, request_handler=_Quiet)
        self.address = self._httpd.socket.getsockname()[:2]  # (host, port) actually bound
        self.port = int(self._httpd.server_port)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="udacity-bridge")
        self._thread.daemon = True
        self._thread.start()

    def call(self, fn: Callable, *args, **kwargs) -> None:
        fn(*args, **kwargs)

    def call_sync(self, fn: Callable, *args, timeout: float = 5.0, **kwargs) -> Any:
        return fn(*args, **kwargs)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class EventletTransport:
    """eventlet.wsgi on a hub in its own OS thread; calls from other threads are queued onto the hub."""

    async_mode = "eventlet"

    def __init__(self, host: str, port: int, app_factory: Callable[[], Any]):
        eventlet = import_eventlet()
        self._calls: deque = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._ready: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._main, args=(eventlet, host, port, app_factory), name="udacity-bridge-eventlet", daemon=True
        )
        self._thread.start()
        self.address = self._ready.result(timeout=10)  # (host, port) bound; raises what binding raised
        self.port = int(self.address[1])

    def _main(self, eventlet, host: str, port: int, app_factory: Callable[[], Any]) -> None:
        try:
            listener = eventlet.listen((host, port))
            # accepted sockets inherit it (Linux): without it Nagle + delayed ACK hold small answers for ~40 ms
            listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            app = app_factory()  # built here: engine.io's green primitives belong to this thread's hub
        except BaseException as exc:
            self._ready.set_exception(exc)
            return
        server = eventlet.spawn(eventlet.wsgi.server, listener, app, log=_DebugLog(), log_output=False)
        wake = eventlet.greenio.GreenSocket(self._wake_r)
        self._ready.set_result(listener.getsockname()[:2])
        running = True
        while running:
            wake.recv(4096)  # cooperative: the hub serves connections while this waits
            while self._calls:
                fn, args, kwargs, future = self._calls.popleft()
                if fn is None:
                    running = False
                    break
                try:
                    result = fn(*args, **kwargs)
                except Exception as exc:  # a session that closed meanwhile: log, never kill the hub
                    log.debug("eventlet call %s failed: %s", getattr(fn, "__name__", fn), exc)
                    if future is not None:
                        future.set_exception(exc)
                    continue
                if future is not None:
                    future.set_result(result)
        server.kill()
        listener.close()
        wake.close()

    def _post(self, item: tuple) -> None:
        self._calls.append(item)
        try:
            self._wake_w.send(b"x")
        except BlockingIOError:  # the wake-up buffer is full: the hub is awake and will drain the deque anyway
            pass
        except OSError as exc:
            log.debug("eventlet hub gone: %s", exc)

    def call(self, fn: Callable, *args, **kwargs) -> None:
        if threading.current_thread() is self._thread:
            fn(*args, **kwargs)
            return
        self._post((fn, args, kwargs, None))

    def call_sync(self, fn: Callable, *args, timeout: float = 5.0, **kwargs) -> Any:
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._post((fn, args, kwargs, future))
        return future.result(timeout=timeout)

    def close(self) -> None:
        if self._thread.is_alive():
            self._post((None, (), {}, None))
            self._thread.join(timeout=5)
        self._wake_w.close()
        self._wake_r.close()


class _DebugLog:
    """eventlet.wsgi's access log, sent to logging at debug level."""

    def write(self, text: str) -> None:
        log.debug("http: %s", text.rstrip())


def make_transport(kind: str, host: str, port: int, app_factory: Callable[[], Any]):
    if kind == "threading":
        return ThreadingTransport(host, port, app_factory)
    if kind == "eventlet":
        return EventletTransport(host, port, app_factory)
    raise TransportError(f"unknown server {kind!r}; choose one of {', '.join(SERVERS)}")
