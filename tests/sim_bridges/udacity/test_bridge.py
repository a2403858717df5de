"""The Udacity bridge: protocol parsing, the socket.io compatibility layer, the transport, the env -- against the
stand-in that speaks the simulator's exact bytes. Every test uses an ephemeral port and leaves no thread behind."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import Counter
from contextlib import contextmanager

import cv2
import gymnasium as gym
import numpy as np
import pytest

from sim_bridges.udacity.bridge import SPEC, UdacityEnv, UdacityServer, check_bridge, register
from sim_bridges.udacity.compat import HOOKS, PINNED, check_compat_hooks
from sim_bridges.udacity.protocol import (
    Limits,
    TelemetryError,
    csharp_float_parse,
    encode_jpeg,
    format_number,
    parse_telemetry,
    steer_payload,
)
from sim_bridges.udacity.sources import MALFORMED, MALFORMED_KINDS, ReplaySource, malformed_packet
from sim_bridges.udacity.standin import StandIn, StandInConfig

FAST_PINGS = {"ping_interval": 0.3, "ping_timeout": 2.0}  # server side; the simulator's are 25 s / 60 s


@pytest.fixture(autouse=True)
def no_leaked_threads():
    """Every server, stand-in and socket thread a test starts must be gone shortly after it ends."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        extra = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not extra:
            return
        time.sleep(0.05)
    pytest.fail(f"threads left running: {[t.name for t in extra]}")


@pytest.fixture(scope="module")
def real_log(shared_data):
    return shared_data / "udacity_sim"


@contextmanager
def running(env_or_server, source, **cfg):
    """A stand-in connected to the env's (or server's) port, stopped and joined on exit."""
    server = env_or_server.server if isinstance(env_or_server, UdacityEnv) else env_or_server
    standin = StandIn(StandInConfig(port=server.port, **{"ping_interval": 0.3, **cfg}), source).start()
    try:
        yield standin
    finally:
        standin.stop()
        standin.join(10)


def drive_until_done(env, standin, policy=lambda obs: np.array([0.1, 0.2], np.float32)):
    """Step the env until the stand-in has finished (its source done, its answers drained); returns the steps.

    A step that times out (a stall on a loaded machine) just waits again while the stand-in still runs."""
    obs, info = env.reset()
    steps = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        obs, _, _, truncated, info = env.step(policy(obs))
        if not truncated:
            steps += 1
        elif not standin.alive:
            return steps
    raise TimeoutError("the stand-in did not finish within 120 s")


def at_step(n, action):
    """A policy (zeros) that runs `action()` once, before its n-th step."""
    calls = []

    def policy(obs):
        calls.append(1)
        if len(calls) == n:
            action()
        return np.zeros(2, np.float32)

    return policy


_HUGE = '42["telemetry",{"image":"' + "A" * (2 << 20) + '"}]'


def assert_all_answered(report, server_stats=None):
    assert report.rejected == [], report.rejected[:3]  # the simulator would have thrown on these
    assert report.unsolicited == 0
    assert report.outstanding == 0, "an unanswered frame stalls the simulator for good"
    assert report.answers == report.telemetry_sent > 0
    assert report.out_of_range == 0
    if server_stats is not None:
        answered = sum(v for k, v in server_stats.items() if k.startswith("answered."))
        assert answered == server_stats["telemetry"] == report.telemetry_sent


# -- protocol ---------------------------------------------------------------------------------------------------------
def test_compat_hooks_present_and_versions_pinned():
    # An upgrade of python-socketio / python-engineio must be a deliberate act: re-run this file, then move the pins.
    assert check_compat_hooks() == PINNED
    assert len(HOOKS) >= 4


def test_control_stock_python_socketio_drops_a_connectless_client(real_log):
    """Why the compatibility layer exists: the stock server never dispatches the simulator's telemetry."""
    import socketio
    from werkzeug.serving import make_server

    sio = socketio.Server(async_mode="threading", logger=False, engineio_logger=False, ping_interval=0.3)
    seen = []
    sio.on("telemetry", lambda sid, data=None: seen.append(sid))
    httpd = make_server("127.0.0.1", 0, socketio.WSGIApp(sio), threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,))
    thread.start()

    try:
        src = ReplaySource(real_log, limit=5, loop=True)
        standin = StandIn(StandInConfig(port=httpd.server_port, ping_interval=0.3, reconnect=False), src).start()
        time.sleep(1.0)
        standin.stop()
        report = standin.join(10)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
        sio.shutdown()
    assert report.telemetry_sent == 2 and seen == [] and report.answers == 0  # the car would never move


def test_parse_real_frame(real_log):
    src = ReplaySource(real_log, limit=3)
    fields = src.telemetry()
    t = parse_telemetry(fields)
    assert t.image.shape == (160, 320, 3) and t.image.dtype == np.uint8
    assert t.jpeg == src.rows[0][0].read_bytes()  # the bytes travel unchanged
    assert t.steering == pytest.approx(src.rows[0][1], abs=1e-4 / 25)
    assert t.speed_mph == pytest.approx(src.rows[0][3], abs=1e-4)
    bgr = cv2.imread(str(src.rows[0][0]))
    np.testing.assert_array_equal(t.image, bgr[..., ::-1])


@pytest.mark.parametrize("kind", MALFORMED_KINDS)
def test_each_malformed_kind_is_refused_for_its_reason(kind, real_log):
    jpeg = ReplaySource(real_log, limit=1).reference_jpeg()
    reason, build = MALFORMED[kind]
    payload = build(jpeg)
    if reason in ("bad_arguments", "undecodable"):  # refused before parsing: checked end to end below
        return
    with pytest.raises(TelemetryError) as err:
        parse_telemetry(payload)
    assert err.value.reason == reason, str(err.value)
    assert err.value.field in str(err.value)


def test_steer_answers_are_4_decimal_strings_in_range():
    assert steer_payload(0.123456, -0.5) == {"steering_angle": "0.1235", "throttle": "-0.5000"}
    assert steer_payload(3.0, -7.0) == {"steering_angle": "1.0000", "throttle": "-1.0000"}
    assert format_number(float("nan")) == "0.0000" and format_number(-1e-9) == "0.0000"
    for value in np.linspace(-1.3, 1.3, 27):
        text = format_number(value)
        assert isinstance(text, str) and -1.0 <= csharp_float_parse(text) <= 1.0
    with pytest.raises(TypeError):
        csharp_float_parse(0.5)  # a JSON number: float.Parse(null) in the simulator
    with pytest.raises(ValueError):
        csharp_float_parse("fast")
    assert csharp_float_parse(" 1,234.5 ") == 1234.5 and csharp_float_parse("1E-05") == 1e-5


def test_limits_are_configurable():
    img = encode_jpeg(np.zeros((160, 320, 3), np.uint8))
    fields = {"steering_angle": "0.0000", "throttle": "0.0000", "speed": "40.0000"}
    fields["image"] = base64.b64encode(img).decode()
    assert parse_telemetry(fields).speed_mph == 40.0
    with pytest.raises(TelemetryError, match="out_of_range"):
        parse_telemetry(fields, Limits(max_speed_mph=30.0))
    with pytest.raises(TelemetryError, match="oversized"):
        parse_telemetry(fields, Limits(max_image_b64=100))


# -- transport and env against the stand-in ------------------------------------------------------------------------
def test_server_binds_localhost_by_default():
    server = UdacityServer(port=0, **FAST_PINGS)
    try:
        assert server.host == "127.0.0.1"
        assert server.address == ("127.0.0.1", server.port)
    finally:
        server.close()


def test_connectless_client_is_answered_with_steer_strings(real_log):
    """The simulator never sends `40`: stock python-socketio 5 would drop its events. Ours answers every one."""
    env = UdacityEnv(port=0, timeout_s=0.3, **FAST_PINGS)
    try:
        with running(env, ReplaySource(real_log, limit=60), send_connect=False) as standin:
            n = drive_until_done(env, standin, lambda obs: np.array([-0.25, 0.5], np.float32))
        report = standin.report
        assert_all_answered(report, env.server.snapshot())
        assert n > 20
        assert report.raw_answers[0] == '42["steer",{"steering_angle":"-0.2500","throttle":"0.5000"}]'
        for raw in report.raw_answers:
            data = json.loads(raw[2:])[1]
            assert all(isinstance(v, str) for v in data.values())
        assert report.connect_acks == 1  # our automatic `40{"sid":...}`, which the simulator ignores
        assert report.steer_values == [(-0.25, 0.5)] * report.steer_answers
    finally:
        env.close()


def test_client_that_sends_connect_keeps_its_session(real_log):
    env = UdacityEnv(port=0, timeout_s=0.3, **FAST_PINGS)
    try:
        with running(env, ReplaySource(real_log, limit=40), send_connect=True) as standin:
            drive_until_done(env, standin)
        assert_all_answered(standin.report, env.server.snapshot())
        assert standin.report.connect_acks == 2  # ours, then the same session confirmed; never CONNECT_ERROR
        assert env.server.snapshot()["connects"] == 1
    finally:
        env.close()


def test_python_socketio_client_connects_over_websocket(real_log):
    import socketio

    server = UdacityServer(port=0, **FAST_PINGS)
    client = socketio.Client()
    got = []
    client.on("steer", got.append)
    client.on("manual", lambda data=None: got.append("manual"))
    try:
        client.connect(f"http://127.0.0.1:{server.port}", transports=["websocket"], wait_timeout=5)
        client.emit("telemetry", ReplaySource(real_log, limit=1).telemetry())
        frame = server.next_frame(5)
        assert frame is not None
        server.answer(frame, 0.3, 0.1)
        client.emit("telemetry", {})
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [{"steering_angle": "0.3000", "throttle": "0.1000"}, "manual"]
    finally:
        client.disconnect()
        server.close()


def test_empty_telemetry_is_answered_manual(real_log):
    env = UdacityEnv(port=0, timeout_s=0.3, **FAST_PINGS)
    try:
        with running(env, ReplaySource(real_log, limit=60), empty_every=3) as standin:
            drive_until_done(env, standin)
        report = standin.report
        assert_all_answered(report, env.server.snapshot())
        assert report.empty_sent >= 15
        assert report.manual_answers == report.empty_sent == env.server.snapshot()["answered.manual"]
    finally:
        env.close()


def test_session_outlives_many_ping_intervals_of_both_sides(real_log):
    env = UdacityEnv(port=0, timeout_s=0.3, ping_interval=0.2, ping_timeout=0.5)
    try:
        src = ReplaySource(real_log, limit=30, loop=True)
        with running(env, src, ping_interval=0.2, duration_s=3.0) as standin:
            # a slow controller: the link idles between frames, only pings keep it alive
            drive_until_done(env, standin, lambda obs: (time.sleep(0.02), np.zeros(2, np.float32))[1])
        report, stats = standin.report, env.server.snapshot()
        assert_all_answered(report, stats)
        assert report.connects == 1 and stats["connects"] == 1 and stats["disconnects"] == 1  # only at the end
        assert report.server_pings >= 8  # the server's pings, every 0.2 s, each answered `3`
        assert report.pings_sent >= 5 and report.pongs_received >= report.pings_sent - 1  # the client's own
        assert stats["client_pings"] == report.pings_sent
    finally:
        env.close()


def test_1000_malformed_frames_mixed_in_never_crash_or_stall(real_log):
    env = UdacityEnv(port=0, timeout_s=0.3, **FAST_PINGS)
    try:
        src = ReplaySource(real_log, limit=200, loop=True)
        with running(env, src, malformed_every=2, max_telemetry=2 * 1020) as standin:
            steps = drive_until_done(env, standin)
        report, stats = standin.report, env.server.snapshot()
        assert report.malformed_sent.total() >= 1000
        assert_all_answered(report, stats)
        assert set(report.malformed_sent) == set(MALFORMED_KINDS)
        expected = Counter()
        for kind, n in report.malformed_sent.items():
            expected[f"refused.{MALFORMED[kind][0]}"] += n
        assert {k: v for k, v in stats.items() if k.startswith("refused.")} == dict(expected)
        assert stats["answered.safe"] == report.malformed_sent.total()  # each one: steer "0.0000"/"0.0000"
        valid = report.telemetry_sent - report.malformed_sent.total()
        assert 1 + steps + stats.get("coalesced", 0) == valid  # reset's frame, each step's, those coalesced
    finally:
        env.close()


def test_unit_malformed_packets_roundtrip_as_text(real_log):
    jpeg = ReplaySource(real_log, limit=1).reference_jpeg()
    kinds = [malformed_packet(i, jpeg)[0] for i in range(len(MALFORMED_KINDS))]
    assert kinds == list(MALFORMED_KINDS)
    for i in range(len(MALFORMED_KINDS)):
        assert malformed_packet(i, jpeg)[1].startswith('42["telemetry"')


def test_a_message_above_the_hard_cap_closes_the_link_and_the_simulator_reconnects(real_log):
    """Beyond max_packet_bytes engine.io drops the connection (memory guard); the session resumes on reconnect."""
    env = UdacityEnv(port=0, timeout_s=0.3, max_packet_bytes=1 << 20, **FAST_PINGS)
    try:
        with running(env, ReplaySource(real_log, limit=80), reconnect=True) as standin:
            drive_until_done(env, standin, at_step(10, lambda: standin._send(_HUGE)))
        stats = env.server.snapshot()
        assert standin.report.connects == 2 and stats["connects"] == 2
        assert standin.report.rejected == [] and standin.source.done
    finally:
        env.close()


def test_flood_is_bounded_and_every_frame_answered(real_log):
    env = UdacityEnv(port=0, timeout_s=0.3, max_pending=4, **FAST_PINGS)

    def wait_for(n):
        deadline = time.monotonic() + 10
        while env.server.snapshot().get("telemetry", 0) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return env.server.snapshot()

    try:
        with running(env, ReplaySource(real_log, limit=40, loop=True), max_telemetry=200) as standin:
            wait_for(2)  # the two frames on open, waiting: the env has not been reset yet
            standin.flood(60)  # far beyond one telemetry per answer
            stats = wait_for(62)
            # at most max_pending frames ever wait; the oldest are answered at once (and, one telemetry per
            # answer, the stand-in sends another for each: the flood keeps its size but cannot grow the queue)
            assert env.server.n_pending == 4
            assert stats["refused.flood"] >= 62 - 4 - 2
            drive_until_done(env, standin)
        report, stats = standin.report, env.server.snapshot()
        assert report.extra_sent == 60
        assert_all_answered(report, stats)
        assert stats["coalesced"] >= 3  # the env took the newest waiting frame; the 3 older ones rode along
    finally:
        env.close()


def test_reconnect_after_a_dropped_connection(real_log):
    env = UdacityEnv(port=0, timeout_s=0.3, **FAST_PINGS)
    try:
        with running(env, ReplaySource(real_log, limit=150), reconnect=True) as standin:
            drive_until_done(env, standin, at_step(40, lambda: standin.drop_connection()))
        stats = env.server.snapshot()
        assert standin.report.connects == 2 and stats["connects"] == 2 and stats["disconnects"] == 2
        assert standin.report.rejected == [] and standin.report.outstanding == 0
        assert standin.source.done  # the replay went on to its end on the new connection
    finally:
        env.close()


def test_check_bridge_and_nondeterministic_spec(real_log):
    assert SPEC.nondeterministic is True
    env = UdacityEnv(port=0, timeout_s=2.0, **FAST_PINGS)
    try:
        with running(env, ReplaySource(real_log, limit=50, loop=True)):
            check_bridge(env)
            assert env.unwrapped.spec.nondeterministic is True
    finally:
        env.close()
    register()
    register()  # idempotent
    made = gym.make("drive/Udacity-v0", port=0, connect_timeout_s=0.2, **FAST_PINGS)
    try:
        assert made.spec.nondeterministic is True
        with pytest.raises(TimeoutError, match="Autonomous Mode"):
            made.reset()
    finally:
        made.close()


def test_step_timeout_truncates_and_reset_timeout_names_the_url():
    env = UdacityEnv(port=0, timeout_s=0.2, connect_timeout_s=0.3, **FAST_PINGS)
    try:
        with pytest.raises(TimeoutError, match=f"127.0.0.1:{env.server.port}"):
            env.reset()
        obs, reward, terminated, truncated, info = env.step(np.zeros(2, np.float32))
        assert truncated and not terminated and info["timeout"] is True and reward == 0.0
    finally:
        env.close()
        env.close()  # idempotent
