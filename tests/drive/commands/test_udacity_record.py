"""`drive udacity record`: the simulator's own log format, frame-by-frame durability, a kill loses nothing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from drive.commands.udacity.record import Config, run
from drive.observe.driving_log import DrivingLogWriter
from sim_bridges.udacity.protocol import MAX_STEER_DEG
from sim_bridges.udacity.sources import ReplaySource
from sim_bridges.udacity.standin import StandIn, StandInConfig
from tests.conftest import REPO
from tests.sim_bridges.udacity.test_bridge import no_leaked_threads, real_log
from tests.sim_bridges.udacity.test_standin import free_port

__all__ = ["no_leaked_threads", "real_log"]
ROW = re.compile(r"^(/\S+\.jpg), , , (-?[\d.E-]+), ([\d.E-]+), ([\d.E-]+), ([\d.E-]+)$")


def _rows(out: Path) -> list[str]:
    text = (out / "driving_log.csv").read_text()
    assert text == "" or text.endswith("\n"), "a partial last row"
    return text.splitlines()


def _record(tmp_path, source, cfg_kw=None, **standin_kw):
    port = free_port()
    cfg = Config(out=str(tmp_path / "rec"), port=port, idle_timeout_s=0.7, connect_timeout_s=20, ping_interval_s=0.3,
                 **(cfg_kw or {}))  # fmt: skip
    result = {}
    recorder = threading.Thread(target=lambda: result.setdefault("code", run(cfg)))
    recorder.start()
    # reconnect: the stand-in retries until the recorder listens, as the simulator does
    standin = StandIn(StandInConfig(port=port, ping_interval=0.3, reconnect=True, **standin_kw), source).start()
    report = standin.join(60)
    recorder.join(60)
    assert not recorder.is_alive()
    return result["code"], report, Path(cfg.out)


def test_record_writes_the_simulators_format_and_the_exact_bytes(real_log, tmp_path):
    src = ReplaySource(real_log, limit=60)
    code, report, out = _record(tmp_path, src)
    rows = _rows(out)
    assert code == 0 and report.outstanding == 0 and report.manual_answers == report.telemetry_sent == 60
    assert len(rows) == 60  # every frame; a disconnect (the stand-in closing) loses none
    for row, (image, steering, throttle, speed) in zip(rows, src.rows, strict=True):
        m = ROW.match(row)
        assert m, row
        path = Path(m.group(1))
        assert path.parent == out.resolve() / "IMG" and re.fullmatch(r"center_\d{4}(_\d\d){5}_\d{3}\.jpg", path.name)
        assert path.read_bytes() == image.read_bytes()
        # --driver manual: the car's own controls, as its telemetry reported them (N4 degrees -> normalised)
        assert float(m.group(2)) == pytest.approx(steering, abs=1e-4 / MAX_STEER_DEG + 1e-7)
        assert float(m.group(3)) == pytest.approx(throttle, abs=1e-4) and float(m.group(4)) == 0
        assert float(m.group(5)) == pytest.approx(speed, abs=1e-4)
    names = [Path(ROW.match(r).group(1)).name for r in rows]
    assert names == sorted(names) and len(set(names)) == 60
    session = json.loads((out / "session.json").read_text())
    assert session["recorded"] == 60 and session["answered.manual"] == 60 and session["refused"] == 0


def test_recording_loads_with_the_project_loader(real_log, tmp_path):
    from datasets.udacity import read_log

    code, _, out = _record(tmp_path, ReplaySource(real_log, limit=12))
    log = read_log(out / "driving_log.csv")
    assert len(log) == 12 and log.left[0] is None and log.right[0] is None


def test_record_with_a_policy_logs_the_commands_sent(real_log, tmp_path):
    code, report, out = _record(tmp_path, ReplaySource(real_log, limit=30), {"driver": "vision"})
    rows = [ROW.match(r) for r in _rows(out)]
    assert code == 0 and len(rows) == 30 == report.steer_answers
    for m, (steering, throttle) in zip(rows, report.steer_values, strict=True):
        assert float(m.group(2)) == pytest.approx(steering, abs=5e-5)
        assert float(m.group(3)) == pytest.approx(max(throttle, 0), abs=5e-5)
        assert float(m.group(4)) == pytest.approx(max(-throttle, 0), abs=5e-5)


def test_malformed_frames_are_answered_and_counted_not_recorded(real_log, tmp_path):
    code, report, out = _record(tmp_path, ReplaySource(real_log, limit=40), malformed_every=4)
    session = json.loads((out / "session.json").read_text())
    assert report.rejected == [] and report.outstanding == 0 and report.answers == report.telemetry_sent
    assert session["refused"] == report.malformed_sent.total() > 0
    assert len(_rows(out)) == session["recorded"] == report.telemetry_sent - report.malformed_sent.total()


def test_writer_appends_and_names_stay_unique(tmp_path):
    w = DrivingLogWriter(tmp_path)
    for i in range(5):
        w.write(b"\xff\xd8\xff" + bytes([i]) + b"\xff\xd9", -0.0, 0.5, 0.0, 1.6e-05)
    w.close()
    w = DrivingLogWriter(tmp_path)
    w.write(b"\xff\xd8\xff\xff\xd9", 0.25, 0.0, 0.3, 30.0)
    w.close()
    rows = _rows(tmp_path)
    assert len(rows) == 6 and len(set(r.split(", ")[0] for r in rows)) == 6
    assert rows[0].endswith(", 0, 0.5, 0, 1.6E-05") and rows[5].endswith(", 0.25, 0, 0.3, 30")
    assert not list(tmp_path.glob("IMG/*.tmp"))


def test_sigkill_during_recording_loses_no_received_frame(real_log, tmp_path):
    """SIGKILL at seeded moments, the recorder restarted into the same --out each time (it appends): every frame
    answered before a kill is on disk, no row is partial or duplicated, and the images match the source in order."""
    import random

    from tests.faults.conftest import TALLY

    out, rng = tmp_path / "rec", random.Random(17)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "drive", "udacity", "record", "--out", str(out), "--port", "0", "--ping-interval-s",
           "0.3"]  # fmt: skip
    sent: list[Path] = []  # the source images in the order the recorder received them, over all sessions
    for point in range(3):
        before = len(_rows(out)) if (out / "driving_log.csv").exists() else 0
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            line = proc.stdout.readline()
            port = int(re.search(r"127\.0\.0\.1:(\d+)/", line).group(1))
            src = ReplaySource(real_log, limit=1000)
            standin = StandIn(StandInConfig(port=port, ping_interval=0.3, reconnect=False), src).start()
            target, deadline = rng.randint(30, 150), time.monotonic() + 60
            while standin.report.answers < target and time.monotonic() < deadline:
                time.sleep(0.002)
            answered = standin.report.answers  # each answer came after its frame was on disk
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            report = standin.join(20)
            TALLY["kill_points"] += 1
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()
        rows = _rows(out)  # no partial row
        new = len(rows) - before
        assert answered >= target and report.answers >= answered, f"kill point {point}"
        assert answered <= new <= report.telemetry_sent, f"kill point {point}: {new} rows for {answered} answers"
        TALLY["lost_episodes"] += max(0, answered - new)  # (frames here: an answered frame missing is lost)
        sent += [image for image, *_ in src.rows[:new]]
    names = [ROW.match(row).group(1) for row in rows]
    TALLY["duplicated_episodes"] += len(names) - len(set(names))
    assert len(set(names)) == len(names) == len(sent)
    for name, image in zip(names, sent, strict=True):  # in order, byte for byte, across the three sessions
        assert Path(name).read_bytes() == image.read_bytes()
    assert len(list(out.glob("IMG/*.tmp*"))) <= 3  # at most the frame each kill interrupted, never listed
