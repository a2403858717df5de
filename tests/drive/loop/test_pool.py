"""run_tasks under Ctrl-C (finished results kept, workers gone at once) and an unreachable `--ray` address (one line,
in seconds, nothing written)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from drive.cli import main
from drive.loop import heap, pool
from drive.loop.pool import DeferredInterrupt, run_tasks


def _sleepy(i: int, pids: str, tick) -> int:
    """Task i: note this worker's pid, finish at once (task 0) or run for a minute (the rest)."""
    Path(pids, f"{i}.{os.getpid()}").touch()
    time.sleep(0.1 if i == 0 else 60)
    return i


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status  # a zombie has stopped running; only its exit status waits for its parent


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads worker states from /proc")
def test_ctrl_c_keeps_finished_results_and_stops_the_workers_at_once(tmp_path):
    got: list[int] = []
    sent: list[float] = []

    def on_result(result: int) -> None:
        got.append(result)
        if result == 0:  # Ctrl-C (to this process only) while the other tasks run
            sent.append(time.monotonic() + 0.5)
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()

    with pytest.raises(KeyboardInterrupt):
        run_tasks(_sleepy, [(i, str(tmp_path)) for i in range(6)], 2, on_result, show=False)
    stopped = time.monotonic() - sent[0]  # the promise is ~5 s; well under 1 s on an idle machine, more under load
    assert got == [0] and stopped < 5.0, (got, stopped)
    pids = {int(p.name.split(".")[1]) for p in tmp_path.iterdir()}
    deadline = time.monotonic() + 5.0
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, pids)), "workers kept running after Ctrl-C"
    assert len(list(tmp_path.iterdir())) <= 3, "tasks started after Ctrl-C"  # task 0 and the two in flight


def test_a_first_sigint_is_noted_and_a_second_raises():
    with DeferredInterrupt() as interrupt:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs at the next bytecode boundary
        assert interrupt.hit
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def _ray():
    ray = pytest.importorskip("ray", reason="ray is not installed (the `distributed` extra)")
    if ray.is_initialized():  # one an earlier test left up would lend its node address instead of the loopback one
        ray.shutdown()
    return ray


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_an_unreachable_ray_address_is_one_line_in_seconds(tmp_path, capsys, monkeypatch, scheme):
    ray = _ray()
    # ray.init dials a loopback host on this node's own IP; Ray's no-cluster mode keeps it loopback for the test
    monkeypatch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
    port = _closed_port()
    address = f"{scheme}127.0.0.1:{port}"
    assert ray._private.services.canonicalize_bootstrap_address(f"127.0.0.1:{port}") == f"127.0.0.1:{port}"
    start = time.monotonic()
    code = main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-1", "--ray", address,
                 "--no-progress", "--out", str(tmp_path / "d")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and time.monotonic() - start < 10
    assert err == [
        f"drive collect: error: --ray {address}: no Ray cluster answers at 127.0.0.1:{port} (Connection"
        " refused); start one there with `ray start --head`, or run on this machine with --ray local"
    ]
    assert not (tmp_path / "d").exists()  # refused before anything is written
    assert not ray.is_initialized()


def test_an_unreachable_ray_address_stops_eval_before_its_output_folders_exist(tmp_path, capsys, monkeypatch):
    ray = _ray()
    monkeypatch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)  # as above: the loopback address
    address = f"127.0.0.1:{_closed_port()}"
    out, trace = tmp_path / "new" / "eval.json", tmp_path / "trace"
    start = time.monotonic()
    code = main(["eval", "--env", "fake-road", "--seeds", "0-1", "--ray", address, "--no-progress", "--out", str(out),
                 "--trace", str(trace)])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and time.monotonic() - start < 5
    assert len(err) == 1 and err[0].startswith(f"drive eval: error: --ray {address}: no Ray cluster answers"), err
    assert not out.parent.exists() and not trace.exists()  # checking --out / --trace would have made them
    assert not ray.is_initialized()


def _worker_state(i: int, tick) -> tuple[int, bool, int]:
    """What a worker holds when its task starts: its pid, whether torch came with it, OpenCV's threads."""
    inherited = "torch" in sys.modules  # before anything here imports it: a spawned worker would not have it
    import cv2

    return os.getpid(), inherited, cv2.getNumThreads()


def test_workers_fork_with_torch_imported_and_run_opencv_on_one_thread():
    import cv2
    import torch  # noqa: F401 - what the commands hold when they start the pool (spawn re-imported it per worker)

    cv2_threads = cv2.getNumThreads()
    got: list[tuple[int, bool, int]] = []
    run_tasks(_worker_state, [(0,), (1,), (2,), (3,)], 2, got.append, show=False)
    assert len(got) == 4 and os.getpid() not in {pid for pid, _, _ in got}
    assert all(inherited and threads == 1 for _, inherited, threads in got), got
    assert cv2.getNumThreads() == cv2_threads  # the driver's own setting is left alone


OPENCV_THEN_FORK = """
import time
import cv2, numpy as np
from drive.loop.pool import run_tasks
big = np.zeros((4096, 4096, 3), np.uint8)
def task(i, tick):
    return int(cv2.cvtColor(big, cv2.COLOR_RGB2GRAY).sum()) + i
if __name__ == "__main__":
    cv2.cvtColor(big, cv2.COLOR_RGB2GRAY)  # the parent's OpenCV thread pool is up
    time.sleep(0.5)  # and its threads asleep: a fork right after the call did not always hang
    got, before = [], cv2.getNumThreads()
    run_tasks(task, [(0,), (1,), (2,)], 2, got.append, show=False)
    print(sorted(got), before, cv2.getNumThreads())
"""


def test_workers_fork_after_the_parent_ran_opencv_on_its_thread_pool(tmp_path):
    """A worker forked while the parent's OpenCV pool existed hung in its first cv2.setNumThreads (for ever)."""
    import subprocess

    script = tmp_path / "opencv_then_fork.py"
    script.write_text(OPENCV_THEN_FORK)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env={**{k: v for k, v in os.environ.items() if k != "OPENCV_FOR_THREADS_NUM"},
                              "PYTHONPATH": str(Path(__file__).resolve().parents[3])})  # fmt: skip
    assert out.returncode == 0, out.stderr
    got, before, after = out.stdout.rsplit(maxsplit=2)
    assert got == "[0, 1, 2]" and after == before  # the driver's own OpenCV setting is given back
    if before == "1":
        pytest.skip("OpenCV runs on one thread on this machine: there is no thread pool to fork under")


@pytest.mark.parametrize(("platform", "cuda", "method"), [("linux", False, "fork"), ("linux", True, "spawn"),
                                                          ("darwin", False, "spawn")])  # fmt: skip
def test_the_pool_forks_unless_cuda_is_up_or_the_system_is_not_linux(monkeypatch, platform, cuda, method):
    import torch

    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(mp, "get_all_start_methods", lambda: ["fork", "spawn", "forkserver"])
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: cuda)
    assert pool._pool_context().get_start_method() == method
    monkeypatch.delitem(sys.modules, "torch")
    assert pool._pool_context().get_start_method() == "fork"  # no torch: fork everywhere it exists, as before


def _lane_task(arg: str, settings: dict, seeds: tuple, tick) -> list[int]:
    return list(seeds)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_progress_bar_counts_episodes_of_lane_tasks(workers, monkeypatch):
    """A task of K seeds (K cars per process) advances the bar by K episodes, and the total is the episodes'."""
    seen: list[tuple[str, int]] = []

    class Recording(pool.FrameProgress):
        def __enter__(self):
            seen.append(("total", self.n_episodes))
            return super().__enter__()

        def update(self, n_finished: int) -> None:
            seen.append(("done", n_finished))
            super().update(n_finished)

    monkeypatch.setattr(pool, "FrameProgress", Recording)
    tasks = [("a", {}, (1, 2, 3)), ("a", {}, (4, 5)), ("a", {}, (6,))]
    got: list[int] = []
    run_tasks(_lane_task, tasks, workers, got.extend, show=False, size=lambda t: len(t[2]))
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    assert seen[0] == ("total", 6) and max(n for kind, n in seen if kind == "done") == 6


@pytest.mark.parametrize("workers", [1, 2])
def test_the_heap_is_collected_and_frozen_once_before_the_first_episodes(workers, monkeypatch):
    """`freeze_heap`: the first run_tasks of a process collects garbage, then freezes what is alive, before any task
    runs (before the pool forks); later runs do neither again."""
    order: list[str] = []
    monkeypatch.setattr(heap, "_FROZEN", False)
    monkeypatch.setattr(heap.gc, "collect", lambda *args: order.append("collect") or 0)
    monkeypatch.setattr(heap.gc, "freeze", lambda: order.append("freeze"))
    tasks = [("a", {}, (1,)), ("a", {}, (2,))]
    for _ in range(2):
        run_tasks(_lane_task, tasks, workers, lambda seeds: order.append(f"task {seeds}"), show=False)
    assert order[:2] == ["collect", "freeze"] and order.count("collect") == order.count("freeze") == 1
    assert sorted(order[2:]) == ["task [1]", "task [1]", "task [2]", "task [2]"]
