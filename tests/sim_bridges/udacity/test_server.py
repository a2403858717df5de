"""Both servers of the bridge (`--server threading|eventlet`) against the byte-faithful stand-in: every frame answered
(malformed ones included), the shipped checkpoint in closed loop over CarRacing, eventlet's fast unmasking equal to
its own, its import warning kept from the user. Latency is measured by `drive bench udacity`, not here."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from drive.errors import UserError
from drive.loop.udacity import checked_server
from sim_bridges.udacity.bridge import UdacityEnv
from sim_bridges.udacity.sources import CarRacingSource, ReplaySource
from sim_bridges.udacity.transport import SERVERS
from tests.conftest import REPO
from tests.sim_bridges.udacity.test_bridge import (  # noqa: F401 - fixtures
    FAST_PINGS,
    assert_all_answered,
    drive_until_done,
    no_leaked_threads,
    real_log,
    running,
)
from tests.sim_bridges.udacity.test_standin import _drive, free_port


@pytest.fixture(params=SERVERS)
def kind(request):
    if request.param == "eventlet":
        pytest.importorskip("eventlet", reason="eventlet is an optional extra: pip install eventlet==0.41.3")
    return request.param


def test_connectless_simulator_gets_one_answer_per_frame_malformed_included(kind, real_log):  # noqa: F811
    env = UdacityEnv(port=0, timeout_s=0.5, kind=kind, **FAST_PINGS)
    try:
        assert env.server.kind == kind and env.server.address == ("127.0.0.1", env.server.port)
        with running(env, ReplaySource(real_log, limit=80, loop=True), max_telemetry=80, malformed_every=4) as st:
            steps = drive_until_done(env, st)
        stats = env.server.snapshot()
        assert_all_answered(st.report, stats)
        assert stats["refused"] == sum(st.report.malformed_sent.values()) == 20
        assert 1 + steps + stats.get("coalesced", 0) == 80 - 20  # reset's frame, each step's, those coalesced
        assert all(isinstance(v, float) and -1 <= v <= 1 for v, _ in st.report.steer_values)
    finally:
        env.close()


def test_shipped_checkpoint_drives_carracing_through_each_server(kind, tmp_path):
    """`drive udacity drive --ckpt checkpoints/udacity_nsac.pt` answers every frame, fuzzed ones included."""
    src = CarRacingSource(seed=3, max_steps=400)
    argv = ["--ckpt", str(REPO / 'checkpoints' / 'udacity_nsac.pt'), "--server", kind, "--max-steps", "40",
            "--display", "none", "--samples", "4", "--run-dir", str(tmp_path)]  # fmt: skip
    try:
        code, report = _drive(argv, src, free_port(), malformed_every=5)
    finally:
        src.close()
    assert code == 0 and report.rejected == [] and report.unsolicited == 0 and report.outstanding <= 2
    assert sum(report.malformed_sent.values()) >= 8 and report.out_of_range == 0
    import json

    session = json.loads((tmp_path / "session.json").read_text())
    # every malformed frame the server read was refused; one still in flight when the drive stops at --max-steps is
    # never read (the simulator's two chains, as `outstanding` above): seen once under load in the full suite
    sent = sum(report.malformed_sent.values())
    assert sent - 2 <= session["server"]["refused"] <= sent
    assert session["server"]["answered.steer"] >= 40


def test_fast_unmasking_equals_eventlets_own():
    pytest.importorskip("eventlet")
    import eventlet.websocket

    from sim_bridges.udacity.transport import fast_apply_mask, import_eventlet

    original = eventlet.websocket.RFC6455WebSocket.__dict__["_apply_mask"]
    import_eventlet()
    reference = original.__func__ if original.__func__ is not fast_apply_mask else None
    rng = np.random.default_rng(0)
    for n in (0, 1, 3, 4, 5, 1000, 30001):
        data, mask = rng.bytes(n), tuple(int(v) for v in rng.integers(0, 256, 4))
        for offset, length in ((0, None), (1, n // 2), (7, n)):
            got = fast_apply_mask(data, mask, length, offset)
            if reference is not None:
                assert got == reference(data, mask, length, offset)
            cut = len(data) if length is None else length
            want = bytes(b ^ mask[(offset + i) % 4] for i, b in enumerate(data[:cut]))
            assert got == want


def test_eventlet_import_warning_stays_out_of_the_users_way():
    pytest.importorskip("eventlet")
    code = "from sim_bridges.udacity.transport import import_eventlet; import_eventlet()"
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == ""


def test_unknown_server_is_a_one_line_error():
    with pytest.raises(UserError, match="unknown server 'gevent'"):
        checked_server("gevent")
    assert checked_server("threading") == "threading"
