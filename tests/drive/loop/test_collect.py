"""`drive collect` and the demonstration format: round trip, determinism, flagging, crash safety, clear errors."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from datasets.demonstrations import MANIFEST, DemonstrationError, Demonstrations, read_manifest
from datasets.frames import ObservationCoder, code_full
from drive.cli import main
from drive.commands.data.info import dataset_summary as summarise
from drive.errors import UserError
from drive.loop.collect import CollectOptions as Config
from drive.loop.collect import collect as _collect
from drive.loop.policies import ExpertPolicy, NoisyPolicy
from drive.loop.rollout import StepRecord, rollout
from drive.observe.demonstrations import recorder_for
from sim_bridges.fake_road import FakeRoadDriver, make_fake_road
from tests.conftest import REPO


def collect(cfg: Config):
    return _collect(cfg, recorder_for)


def fake(out: Path, **kw) -> Config:
    base = dict(
        out=out, env="fake-road", expert="pursuit", seeds="0-2", max_episode_steps=120, min_return=0.0, progress=False
    )
    base.update(kw)
    return Config(**base)


def replay(seed: int, noise: float, noise_seed: int, steps: int) -> list[StepRecord]:
    """The same episode driven again outside the collector, as the ground truth for what was recorded."""
    env = make_fake_road(max_episode_steps=steps)
    policy = NoisyPolicy(ExpertPolicy(FakeRoadDriver()), noise, env.action_space.low, env.action_space.high, noise_seed)
    records: list[StepRecord] = []
    rollout(env, policy, seeds=[seed], on_step=records.append)
    return records


def test_round_trip_frames_stacks_labels_and_noisy_actions(tmp_path):
    summary = collect(fake(tmp_path, action_noise=0.2, noise_seed=3, keep_raw=True))
    assert sorted(r["seed"] for r in summary.new) == [0, 1, 2]
    ds = Demonstrations(tmp_path)
    assert ds.seeds == [0, 1, 2] and ds.n_frames == 360
    for episode in ds:
        truth = replay(episode.seed, 0.2, 3, 120)
        coder = ObservationCoder("full", "frames", 4)  # what the closed loop feeds a controller, step by step
        live = np.stack([coder(r.obs)[0].numpy() for r in truth])  # (120, 4, 84, 84)
        assert len(episode) == len(truth) == 120
        assert episode.frames.shape == (120 + 3, 84, 84)  # each frame once, plus the reset padding
        np.testing.assert_array_equal(episode.stacks(), live)
        np.testing.assert_array_equal(episode.stack(57), live[57])
        np.testing.assert_array_equal(episode.label, np.stack([r.label for r in truth]))
        np.testing.assert_array_equal(episode.action, np.stack([r.action for r in truth]))
        np.testing.assert_array_equal(episode.state, np.stack([r.info["state"] for r in truth]))
        np.testing.assert_array_equal(episode.raw, np.stack([r.obs for r in truth]))
        np.testing.assert_allclose(episode.reward, [r.reward for r in truth], rtol=1e-6)
        np.testing.assert_allclose(episode.progress, [r.next_info["progress"] for r in truth])
        assert episode.meta["return"] == pytest.approx(sum(r.reward for r in truth))
        assert episode.meta["completion"] == pytest.approx(truth[-1].next_info["progress"])
        # DART: the executed action is perturbed, the label is the clean expert action in the state reached
        assert np.abs(episode.action - episode.label).mean() > 0.05
        clean = [FakeRoadDriver().act(s) for s in episode.state]
        np.testing.assert_allclose(episode.label, np.clip(clean, [-1, 0, 0], [1, 1, 1]), atol=1e-6)
    arrays = ds.arrays([0, 2])
    assert arrays["obs"].shape == (240, 4, 84, 84) and arrays["label"].shape == (240, 3)
    train, val = ds.split(val_fraction=0.34, seed=1)
    assert len(val) == 1 and sorted(train + val) == [0, 1, 2]


def test_shards_are_deterministic_across_workers(tmp_path):
    one = collect(fake(tmp_path / "one", action_noise=0.1, seeds="0-3", workers=1))
    two = collect(fake(tmp_path / "two", action_noise=0.1, seeds="0-3", workers=2))
    assert {r["seed"]: r["sha256"] for r in one.new} == {r["seed"]: r["sha256"] for r in two.new}
    assert [e["seed"] for e in read_manifest(tmp_path / "two")["episodes"]] == [0, 1, 2, 3]


def test_shards_do_not_depend_on_the_cars_per_process(tmp_path):
    """--envs 3 (lanes, 5 seeds: a lane takes a second episode, one lane idles at the end) writes the same bytes."""
    one = collect(fake(tmp_path / "one", action_noise=0.1, seeds="0-4", envs=1))
    three = collect(fake(tmp_path / "three", action_noise=0.1, seeds="0-4", envs=3, workers=2))
    assert {r["seed"]: r["sha256"] for r in one.new} == {r["seed"]: r["sha256"] for r in three.new}
    assert [e["seed"] for e in read_manifest(tmp_path / "three")["episodes"]] == [0, 1, 2, 3, 4]


def test_ppo_shards_do_not_depend_on_the_cars_per_process(tmp_path):
    """On CarRacing the PPO expert answers the lanes in one forward (drive/loop/lanes.py): the same bytes."""
    base = dict(expert="ppo", seeds="7-9", max_episode_steps=40, min_return=0.0, progress=False, action_noise=0.1)
    one = collect(Config(out=tmp_path / "one", envs=1, **base))
    three = collect(Config(out=tmp_path / "three", envs=3, **base))
    assert {r["seed"]: r["sha256"] for r in one.new} == {r["seed"]: r["sha256"] for r in three.new}


def test_low_return_episodes_are_flagged_and_excluded_by_default(tmp_path):
    everything = collect(fake(tmp_path / "all", action_noise=0.3, seeds="0-3", max_episode_steps=200))
    returns = {r["seed"]: r["return"] for r in everything.new}
    threshold = float(np.median(list(returns.values())))
    low = sorted(s for s, r in returns.items() if r < threshold)
    assert 0 < len(low) < 4, returns  # the noise makes the returns differ, so the threshold splits them
    collect(fake(tmp_path / "cut", action_noise=0.3, seeds="0-3", max_episode_steps=200, min_return=threshold))
    ds = Demonstrations(tmp_path / "cut")
    assert ds.seeds == sorted(set(returns) - set(low)) and ds.n_flagged == len(low)
    assert Demonstrations(tmp_path / "cut", include_flagged=True).seeds == [0, 1, 2, 3]
    assert Demonstrations(tmp_path / "all", min_return=threshold).seeds == ds.seeds  # re-flagged when read
    with pytest.raises(KeyError, match="not among"):
        ds.load(low[0])
    info = summarise(tmp_path / "cut", verify=True)
    assert info["flagged"] == len(low) and info["flagged_seeds"] == low and info["verified"] == 4
    assert info["frames"] == 800 and info["usable_frames"] == 200 * (4 - len(low))
    assert info["return"]["min"] == pytest.approx(min(returns.values()))


def test_corrupt_truncated_or_missing_files_get_errors_naming_them(tmp_path):
    collect(fake(tmp_path, seeds="0-1"))
    shard = tmp_path / "episodes" / "seed_000001.npz"
    data = shard.read_bytes()
    ds = Demonstrations(tmp_path)
    ds.load(1)
    shard.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(DemonstrationError, match="seed_000001.npz"):
        ds.load(1)
    with pytest.raises(DemonstrationError, match=r"seed_000001\.npz: \d+ bytes, the manifest says \d+ \(truncated"):
        Demonstrations(tmp_path, verify=False)  # the size check runs when any reader opens the dataset
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(flipped))  # same size, different content
    with pytest.raises(DemonstrationError, match=r"seed_000001\.npz: shard does not match the manifest"):
        ds.load(1)
    shard.unlink()
    with pytest.raises(DemonstrationError, match=r"seed_000001\.npz: cannot read"):
        ds.load(1)
    ds.load(0)  # the other episode is untouched

    manifest = tmp_path / MANIFEST
    text = manifest.read_text()
    manifest.write_text(text[: len(text) // 2])
    with pytest.raises(DemonstrationError, match=r"manifest\.json: corrupt or truncated manifest"):
        Demonstrations(tmp_path)
    broken = json.loads(text)
    del broken["episodes"][0]["sha256"]
    manifest.write_text(json.dumps(broken))
    with pytest.raises(DemonstrationError, match=r"manifest\.json: episodes\[0\] lacks field\(s\) \['sha256'\]"):
        Demonstrations(tmp_path)
    with pytest.raises(DemonstrationError, match="nowhere: no such folder"):
        Demonstrations(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DemonstrationError, match=r"empty: holds no manifest\.json, so it is not a recorded dataset"):
        Demonstrations(tmp_path / "empty")


def test_resume_refuses_other_settings_and_a_second_writer(tmp_path):
    collect(fake(tmp_path, seeds="0"))
    with pytest.raises(UserError, match=r"manifest\.json was recorded with other settings \(action_noise"):
        collect(fake(tmp_path, seeds="0-1", action_noise=0.5))
    with open(tmp_path / ".collect.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(UserError, match="another process is writing"):
            collect(fake(tmp_path, seeds="0-1"))
    # more seeds with the same settings extend the dataset; leftovers of a killed writer are ignored, then redone
    (tmp_path / "episodes" / ".seed_000001.npz.999.tmp").write_bytes(b"half")
    (tmp_path / "episodes" / "seed_000001.npz").write_bytes(b"renamed but never listed")
    assert Demonstrations(tmp_path).seeds == [0]
    summary = collect(fake(tmp_path, seeds="0-1"))
    assert [r["seed"] for r in summary.new] == [1] and summary.skipped == 1
    assert Demonstrations(tmp_path).load(1).label.shape == (120, 3)
    assert not list((tmp_path / "episodes").glob(".*.tmp"))


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


@pytest.mark.skipif(sys.platform != "linux", reason="uses /proc and PR_SET_PDEATHSIG")
def test_sigkilled_collection_resumes_with_nothing_lost(tmp_path):
    out = tmp_path / "data"
    args = [
        sys.executable,
        "-m",
        "drive",
        "collect",
        "--env",
        "fake-road",
        "--expert",
        "pursuit",
        "--seeds",
        "0-23",
        "--max-episode-steps",
        "1000",
        "--action-noise",
        "0.1",
        "--min-return",
        "0",
        "--workers",
        "2",
        "--no-progress",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if len(read_manifest(out)["episodes"]) >= 3:
                break
        except DemonstrationError:
            pass  # not written yet
        time.sleep(0.005)
    assert proc.poll() is None, f"collection ended before it could be killed: {proc.stderr.read().decode()}"
    workers = _children(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{w}").exists() for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(Path(f"/proc/{w}").exists() for w in workers), "workers outlived the killed collection"

    with pytest.raises(DemonstrationError, match="incomplete"):
        Demonstrations(out)  # a stopped run is not a dataset to train on
    before = Demonstrations(out, verify=True, allow_pending=True)
    finished = {e["seed"]: (e["sha256"], (out / e["file"]).stat().st_mtime_ns) for e in before.episodes}
    assert 3 <= len(finished) < 24
    for episode in before:  # everything the manifest lists is whole
        assert len(episode) == episode.meta["steps"]

    rerun = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(finished)} already there" in rerun.stdout
    after = Demonstrations(out, verify=True)
    assert after.seeds == list(range(24))
    for e in after.episodes:
        if e["seed"] in finished:  # kept, not recorded again
            assert (e["sha256"], (out / e["file"]).stat().st_mtime_ns) == finished[e["seed"]]
    reference = collect(fake(tmp_path / "reference", seeds="0-23", max_episode_steps=1000, action_noise=0.1))
    assert {r["seed"]: r["sha256"] for r in reference.new} == {e["seed"]: e["sha256"] for e in after.episodes}


def test_cli_collect_and_data_info(tmp_path, capsys):
    out = tmp_path / "d"
    code = main(
        [
            "collect",
            "--env",
            "fake-road",
            "--expert",
            "pursuit",
            "--episodes",
            "2",
            "--seeds",
            "5-9",
            "--max-episode-steps",
            "50",
            "--min-return",
            "0",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert "recorded 2 new episode(s), 100 frames" in capsys.readouterr().out
    assert main(["data", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["episodes"] == 2 and info["frames"] == 100 and info["seeds"] == "5-6" and info["expert"] == "pursuit"
    assert main(["data", "info", str(out)]) == 0
    assert "2 (2 usable, 0 flagged)" in capsys.readouterr().out
    assert main(["collect", "--env", "fake-road", "--expert", "ppo", "--seeds", "0", "--out", str(tmp_path / "x")]) == 2
    assert "only its scripted driver" in capsys.readouterr().err


def test_the_inspect_hint_is_a_command_that_runs_for_a_path_with_spaces(tmp_path, capsys):
    out = tmp_path / "my demos"
    assert main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0", "--max-episode-steps", "20",
                 "--min-return", "-1000", "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    hint = [line for line in capsys.readouterr().out.splitlines() if line.startswith("inspect with: ")]
    assert len(hint) == 1
    words = shlex.split(hint[0].removeprefix("inspect with: "))
    assert words == ["drive", "data", "info", str(out)]  # pasted into a shell, the path stays one word
    assert main(words[1:]) == 0


def test_carracing_round_trip_with_raw_frames(tmp_path):
    collect(
        Config(
            out=tmp_path,
            expert="pursuit",
            seeds="3",
            max_episode_steps=25,
            keep_raw=True,
            action_noise=0.1,
            min_return=-1e9,
            progress=False,
        )
    )
    episode = Demonstrations(tmp_path).load(3)
    assert len(episode) == 25 and episode.raw.shape == (25, 96, 96, 3) and episode.state.ndim == 2
    for t in (0, 12, 24):  # the stored frame is the full-coded raw frame of the same step (the default coding)
        np.testing.assert_array_equal(episode.stack(t)[-1], code_full(episode.raw[t]))
    np.testing.assert_array_equal(episode.stack(0), np.repeat(episode.stack(0)[-1:], 4, 0))
    assert np.all(episode.action[:, 0] != episode.label[:, 0])  # steering is never clipped here
