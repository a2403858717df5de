"""The Ray engine of run_tasks: the same dataset bytes as the process pool, resumable, a killed worker loses nothing."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from drive.loop.collect import CollectOptions, collect
from drive.loop.evaluate import EvalOptions, evaluate
from drive.loop.pool import run_tasks
from drive.observe.demonstrations import recorder_for


def _require_ray():
    try:
        import ray
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("ray is not installed (the `distributed` extra: pip install ray==2.60.0)")
        pytest.skip("ray is not installed (the `distributed` extra: pip install ray==2.60.0)")
    return ray


@pytest.fixture(scope="module")
def ray_cluster():
    """One local two-CPU Ray instance for the module (run_tasks joins an initialised Ray and leaves it running)."""
    ray = _require_ray()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 2**20, log_to_driver=False)
    yield ray
    ray.shutdown()


def fake(out: Path, **kw) -> CollectOptions:
    base = dict(out=out, env="fake-road", expert="pursuit", seeds="0-3", max_episode_steps=60, min_return=0.0,
                action_noise=0.1, progress=False)  # fmt: skip
    return CollectOptions(**{**base, **kw})


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, bytes]:
    """The dataset the local process pool records on seeds 0-3."""
    root = tmp_path_factory.mktemp("pool")
    collect(fake(root, workers=2), recorder_for)
    return files(root)


def test_ray_collection_is_byte_identical_to_the_process_pool_and_resumes(ray_cluster, reference, tmp_path):
    first = collect(fake(tmp_path, seeds="0-1", workers=2, ray="local"), recorder_for)
    assert sorted(r["seed"] for r in first.new) == [0, 1]
    again = collect(fake(tmp_path, workers=2, ray="local"), recorder_for)  # resumes: only seeds 2 and 3 are new
    assert sorted(r["seed"] for r in again.new) == [2, 3] and again.skipped == 2
    got = files(tmp_path)
    assert sorted(got) == sorted(reference)
    assert got == reference  # every shard and the manifest, byte for byte


class KillOnce:
    """Recorder factory whose episode of `seed` SIGKILLs its own worker process at step 30, the first time only."""

    def __init__(self, marker: str, seed: int):
        self.marker, self.seed = marker, seed

    def __call__(self, settings):
        recorder = recorder_for(settings)
        marker, seed = self.marker, self.seed

        def observe(rec):
            recorder(rec)
            if rec.seed == seed and rec.t == 30 and not os.path.exists(marker):
                Path(marker).write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-episode, its shard unwritten

        observe.arrays = recorder.arrays  # type: ignore[attr-defined]
        return observe


def test_a_worker_killed_mid_episode_is_retried_and_nothing_is_lost(ray_cluster, reference, tmp_path):
    marker = tmp_path / "killed.pid"
    out = tmp_path / "data"
    summary = collect(fake(out, workers=2, ray="local"), KillOnce(str(marker), seed=2))
    assert marker.is_file(), "the worker was never killed: the test did not test anything"
    assert sorted(r["seed"] for r in summary.new) == [0, 1, 2, 3]
    assert files(out) == reference


def test_ray_evaluation_matches_the_local_run(ray_cluster):
    opts = EvalOptions(policy="expert:pursuit", seeds="0-2", env="fake-road", max_episode_steps=60, progress=False)
    local = evaluate(opts)
    remote = evaluate(EvalOptions(**{**opts.__dict__, "workers": 2, "ray": "local"}))
    strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in local["episodes"]]
    assert [{k: v for k, v in r.items() if k != "wall_s"} for r in remote["episodes"]] == strip
    assert remote["mean_return"] == local["mean_return"]


def _sleepy(i: int, pids: str, tick) -> int:
    """Task i: note its worker's pid, finish at once (task 0) or run for a minute (the rest)."""
    Path(pids, f"{i}.{os.getpid()}").touch()
    time.sleep(0.1 if i == 0 else 60)
    return i


def test_ctrl_c_keeps_finished_results_and_cancels_the_ray_tasks(ray_cluster, tmp_path):
    got: list[int] = []
    sent: list[float] = []

    def on_result(result: int) -> None:
        got.append(result)
        if result == 0:
            sent.append(time.monotonic() + 0.5)
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()

    with pytest.raises(KeyboardInterrupt):
        run_tasks(_sleepy, [(i, str(tmp_path)) for i in range(6)], 2, on_result, show=False, ray="local")
    assert got == [0] and time.monotonic() - sent[0] < 3.0
    # the workers of the tasks in flight (task 0's may stay on, idle, in Ray's worker pool)
    pids = {int(p.name.split(".")[1]) for p in tmp_path.iterdir() if not p.name.startswith("0.")}
    deadline = time.monotonic() + 5.0
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids), "Ray tasks kept running after Ctrl-C"
    assert len(list(tmp_path.iterdir())) <= 3  # task 0 and the two in flight: nothing started after Ctrl-C


@pytest.mark.skipif(not (Path(__file__).resolve().parents[3] / "checkpoints" / "carracing_nsac.pt").exists(),
                    reason="the shipped NSAC checkpoint is absent")  # fmt: skip
def test_ray_misbehaviour_cells_equal_the_process_pool_s(ray_cluster, tmp_path):
    """`drive bench misbehaviour --ray`: the monitors (SelfOracle-free, ThirdEye's Grad-CAM) travel to Ray workers
    and every per-step array and record comes back as the local run makes it."""
    import numpy as np

    from drive.loop.options import SHIPPED_CONTROLLER
    from drive.studies.misbehaviour.cells import Cell, RunSettings, run_cell

    cell = Cell(str(SHIPPED_CONTROLLER), "blur:4", (7100, 7101))
    settings = RunSettings(max_episode_steps=80, workers=2, envs=1, progress=False)
    local = run_cell(cell, settings)
    remote = run_cell(cell, RunSettings(**{**settings.__dict__, "ray": "local"}))
    assert [r["seed"] for r in remote] == [7100, 7101]
    for a, b in zip(local, remote, strict=True):
        for key in ("signals", "busy", "monitor_scores"):
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)
        assert a["return"] == b["return"] and a.get("events") == b.get("events")
