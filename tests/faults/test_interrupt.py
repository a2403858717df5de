"""Ctrl-C as a terminal sends it (SIGINT to the whole process group) in `drive collect --workers 2`: the command stops
within seconds with one line and exit 130, every finished episode is in the manifest, and the same command then
records only the missing seeds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from datasets.demonstrations import DemonstrationError, Demonstrations, read_manifest
from drive.cli import main
from tests.conftest import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
N = 12
COLLECT = ["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", f"0-{N - 1}", "--max-episode-steps",
           "300", "--action-noise", "0.1", "--min-return", "-1000", "--no-progress", "--out"]  # fmt: skip
# Stopping takes well under a second; the rest is the interpreter's own exit (torch), slower on a loaded machine.
# Before the fix the workers went on through every queued seed (18 s for these 12 on two busy cores).
STOP_S = 10.0


def test_ctrl_c_to_the_process_group_stops_collect_at_once_and_the_rerun_resumes(tmp_path, capsys):
    out = tmp_path / "d"
    args = [sys.executable, "-m", "drive", *COLLECT, str(out), "--workers", "2"]
    proc = subprocess.Popen(args, cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if read_manifest(out)["episodes"]:
                break
        except DemonstrationError:
            pass  # not written yet
        time.sleep(0.02)
    assert proc.poll() is None, f"collection ended before the interrupt: {proc.stderr.read().decode()}"  # type: ignore[union-attr]
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the command and its workers
    _, err = proc.communicate(timeout=300)
    stopped = time.monotonic() - sent
    assert proc.returncode == 130 and err.decode().split("\n") == [
        "drive collect: interrupted; rerun the same command to continue (what finished is kept)",
        "",
    ], err.decode()
    assert stopped < STOP_S, f"took {stopped:.1f} s to stop"

    manifest = read_manifest(out)
    kept = {e["seed"]: (out / e["file"]).stat().st_mtime_ns for e in manifest["episodes"]}
    assert kept and sorted([*kept, *manifest["pending"]]) == list(range(N))
    shards = list((out / "episodes").glob("*.npz"))
    assert len(shards) <= len(kept) + 2, "workers went on recording after Ctrl-C"  # at most the two in flight
    capsys.readouterr()
    assert main([*COLLECT, str(out), "--workers", "1"]) == 0  # the same command, resumed (workers: not a setting)
    assert f"recorded {N - len(kept)} new episode(s)" in capsys.readouterr().out
    after = Demonstrations(out, verify=True)
    assert after.seeds == list(range(N))
    assert {e["seed"]: (out / e["file"]).stat().st_mtime_ns for e in after.episodes if e["seed"] in kept} == kept
