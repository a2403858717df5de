"""SIGKILL at seeded random moments, then the same command again: nothing lost, nothing duplicated, and the result
equals an uninterrupted run: collection, DAgger, training and `drive bench offline`."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from datasets.demonstrations import DemonstrationError, Demonstrations
from tests.conftest import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _run(args, cwd, kill_after: float | None = None) -> int | None:
    """Run `python -m drive ARGS`; with kill_after, SIGKILL it then (None if it finished first)."""
    proc = subprocess.Popen([sys.executable, "-m", "drive", *args], cwd=cwd, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    if kill_after is None:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()
        return proc.returncode
    try:
        proc.wait(timeout=kill_after)
        return None  # finished before the kill point
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the command and its workers
        proc.wait()
        return -9


def _kill_rounds(args, cwd, rng: random.Random, n: int, window: tuple[float, float], tally) -> None:
    """Start the command n times into the same output, each SIGKILLed at a seeded moment in `window` seconds."""
    for _ in range(n):
        if _run(args, cwd, kill_after=rng.uniform(*window)) == -9:
            tally["kill_points"] += 1


def _same_dataset(out, expected: dict, tally, point: int) -> None:
    """The rerun's dataset equals the uninterrupted one (seed -> sha256); lost / duplicated episodes counted."""
    got = [(e["seed"], e["sha256"]) for e in Demonstrations(out, verify=True).episodes]
    seeds = [s for s, _ in got]
    tally["duplicated_episodes"] += len(seeds) - len(set(seeds))
    tally["lost_episodes"] += len(set(expected) - set(seeds))
    assert dict(got) == expected, f"kill point {point}: {out} differs from the uninterrupted run"
    assert not list(out.rglob("*.tmp*")), "a temp file survived the rerun"


COLLECT = ["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-11", "--max-episode-steps", "300",
           "--action-noise", "0.1", "--min-return", "-1000", "--workers", "2", "--no-progress", "--out"]  # fmt: skip


# one kill point by default (100 s -> ~35 s of the default suite on 2 cores); all three with `pytest -m slow`
KILL_POINTS = pytest.mark.parametrize("n_points", [1, pytest.param(3, marks=pytest.mark.slow)], ids=["one", "three"])


@KILL_POINTS
def test_collection_killed_at_random_moments(tmp_path, tally, n_points):
    reference = tmp_path / "reference"
    _run([*COLLECT, str(reference)], tmp_path)
    expected = {e["seed"]: e["sha256"] for e in Demonstrations(reference).episodes}
    rng = random.Random(7)
    for point in range(n_points):
        out = tmp_path / f"killed{point}"
        _kill_rounds([*COLLECT, str(out)], tmp_path, rng, 3, (2.5, 6.0), tally)  # several kills, then it may finish
        _run([*COLLECT, str(out)], tmp_path)
        _same_dataset(out, expected, tally, point)


TRAIN = ["train", "--controller", "gmle", "--task", "spiral", "--epochs", "4", "--no-progress", "--threads", "1",
         "--set", "task.n_obs=20", "encoder.d_model=8", "n_heads=2", "trainer.tensorboard=false", "--out"]  # fmt: skip


FRAMES = ["--epochs", "4", "--no-progress", "--threads", "1", "--batch-size", "16", "--set", "encoder.d_model=8",
          "n_heads=2", "trainer.tensorboard=false", "--out"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("controller", ["gmle", "nsac", "de"])
def test_training_killed_at_random_moments_resumes_exactly(tmp_path, tally, controller):
    """GMLE on the spiral; NSAC and the deep ensemble on frames (fake-road demonstrations), whose validation and
    members draw from the global RNG: every rerun ends with the uninterrupted run's epochs and weights."""
    import torch

    from drive import checkpoint

    if controller == "gmle":
        train = TRAIN
    else:
        _run([*COLLECT[:6], "0-5", "--max-episode-steps", "60", "--min-return", "0", "--no-progress", "--out",
              str(tmp_path / "demos")], tmp_path)  # fmt: skip
        train = ["train", "--controller", controller, "--data", str(tmp_path / "demos"), *FRAMES]
    reference = tmp_path / "reference"
    _run([*train, str(reference)], tmp_path)
    expected = json.loads((reference / "metrics.json").read_text())
    weights = checkpoint.read(reference / "best.pt", kind="controller")["state_dict"]
    rng = random.Random(11)
    for point in range(3):
        out = tmp_path / f"killed{point}"
        start = time.monotonic()
        if _run([*train, str(out)], tmp_path, kill_after=rng.uniform(4.0, 14.0)) == -9:
            tally["kill_points"] += 1
        if not (out / "metrics.json").is_file():
            _run([*train, str(out)], tmp_path)  # the same command: it resumes
        got = json.loads((out / "metrics.json").read_text())
        assert got["fit"]["best_val_nll"] == expected["fit"]["best_val_nll"], f"kill point {point}"
        assert got["val"] == expected["val"]
        rows = [json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert rows == [1, 2, 3, 4], rows  # no epoch lost or logged twice
        ours = checkpoint.read(out / "best.pt", kind="controller")["state_dict"]
        assert all(torch.equal(ours[k], weights[k]) for k in weights), f"kill point {point}: other weights"
        assert time.monotonic() - start < 600


def test_ctrl_c_is_one_line_and_the_run_resumes(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "drive", *TRAIN, str(out)], cwd=tmp_path, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (out / "config.json").is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the run finished before the interrupt")
    lines = [line for line in err.decode().splitlines() if line.strip() and not line.startswith(("INFO", "epoch"))]
    again = "drive train: interrupted; rerun the same command to continue (what finished is kept)"
    assert proc.returncode == 130 and lines == [again], err.decode()
    _run([*TRAIN, str(out), "--resume"], tmp_path)  # resumable, whatever the moment of the interrupt
    assert (out / "metrics.json").is_file()


def _tiny_clone(path) -> None:
    import torch

    from agents.encoders import EncoderConfig
    from agents.nsac import NSACConfig
    from agents.registry import config_to_dict
    from drive import checkpoint

    torch.manual_seed(0)
    cfg = NSACConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=2)
    checkpoint.save(path, kind="controller", name="nsac", config=config_to_dict(cfg), module=cfg.build())


@KILL_POINTS
def test_dagger_killed_at_random_moments(tmp_path, tally, n_points):
    demos, clone = tmp_path / "demos", tmp_path / "clone.pt"
    _run([*COLLECT[: COLLECT.index("--seeds") + 1], "0-1", *COLLECT[COLLECT.index("--seeds") + 2 :], str(demos)],
         tmp_path)  # fmt: skip
    _tiny_clone(clone)
    dagger = ["dagger", "--ckpt", str(clone), "--data", str(demos), "--seeds", "50-57", "--env", "fake-road",
              "--max-episode-steps", "150", "--beta", "0.5", "--workers", "2", "--no-progress", "--out"]  # fmt: skip
    reference = tmp_path / "reference"
    _run([*dagger, str(reference)], tmp_path)
    expected = {e["seed"]: e["sha256"] for e in Demonstrations(reference).episodes}
    rng = random.Random(13)
    for point in range(n_points):
        out = tmp_path / f"killed{point}"
        for _ in range(2):
            _kill_rounds([*dagger, str(out)], tmp_path, rng, 1, (3.0, 7.0), tally)
            if (out / "manifest.json").is_file() and json.loads((out / "manifest.json").read_text())["pending"]:
                with pytest.raises(DemonstrationError, match="incomplete"):
                    Demonstrations(out)  # a stopped run is never mistaken for a dataset
        _run([*dagger, str(out)], tmp_path)
        _same_dataset(out, expected, tally, point)


BENCH = ["bench", "offline", "--task", "spiral", "--controllers", "gmle", "mcd", "--seeds", "2", "--epochs", "3",
         "--set", "task.n_obs=20", "encoder.d_model=8", "n_heads=2", "trainer.tensorboard=false", "--threads", "1",
         "--no-progress", "--out"]  # fmt: skip


@pytest.mark.slow
def test_bench_offline_killed_at_random_moments(tmp_path, tally):
    reference = tmp_path / "reference"
    _run([*BENCH, str(reference)], tmp_path)

    def cells(root):
        return {str(p.parent.relative_to(root)): json.loads(p.read_text())["fit"]["best_val_nll"]
                for p in sorted((root / "runs").rglob("metrics.json"))}  # fmt: skip

    expected = cells(reference)
    assert len(expected) == 4
    rng = random.Random(19)
    for point in range(2):
        out = tmp_path / f"killed{point}"
        _kill_rounds([*BENCH, str(out)], tmp_path, rng, 2, (5.0, 20.0), tally)
        _run([*BENCH, str(out)], tmp_path)
        got = cells(out)
        tally["lost_episodes"] += len(set(expected) - set(got))  # (cells here)
        assert got == expected, f"kill point {point}: the grid differs from the uninterrupted one"
        for log in (out / "runs").rglob("metrics.jsonl"):
            epochs = [json.loads(line)["epoch"] for line in log.read_text().splitlines()]
            tally["duplicated_episodes"] += len(epochs) - len(set(epochs))
            assert epochs == [1, 2, 3], (log, epochs)
        assert not list((out / "runs").glob("*/*/*.stale-*")), "a killed cell was set aside instead of resumed"
