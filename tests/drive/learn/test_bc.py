"""Behaviour cloning end to end: collect -> train (tiny) -> eval (closed loop, shadow expert, fallback) -> replay.

Everything runs on the fake road (sim_bridges/fake_road.py: same contract as the CarRacing bridge, thousands of
steps per second) through the real CLI, in-process.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from datasets.demonstrations import DemonstrationError, Demonstrations
from datasets.frames import code_cropped, code_full, motion_stack
from drive.cli import main
from drive.learn import tasks
from drive.learn.tasks.demos import split_seeds
from drive.loop.specs import controller_policy as load_controller_policy
from drive.observe.trace import read_trace
from drive.observe.video import read_video


def build(data, **options):
    return tasks.load("demos", tasks.options("demos", {k: str(v) for k, v in options.items()}), data, 0)


EPISODE_STEPS = 60
EVAL_STEPS = 30


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos") / "fake"
    code = main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-5", "--out", str(out),
                 "--max-episode-steps", str(EPISODE_STEPS), "--action-noise", "0.2", "--min-return", "-1000",
                 "--keep-raw", "--no-progress"])  # fmt: skip
    assert code == 0
    return out


def test_split_is_by_episode_and_reproducible():
    seeds = list(range(20))
    train, val, test = split_seeds(seeds, 0.1, 0.2, seed=3)
    assert sorted(train + val + test) == seeds
    assert (len(val), len(test)) == (2, 4)
    assert split_seeds(seeds, 0.1, 0.2, seed=3) == (train, val, test)
    assert split_seeds(seeds, 0.1, 0.2, seed=4) != (train, val, test)
    with pytest.raises(ValueError, match="cannot be split"):
        split_seeds([1, 2], 0.4, 0.4, seed=0)
    with pytest.raises(ValueError, match="sum < 1"):
        split_seeds(seeds, 0.6, 0.6, seed=0)


def test_task_yields_the_recorded_stacks_and_clean_labels(demos):
    options = {"val_fraction": "0.2", "test_fraction": "0.2", "input": "frames"}
    data = build(demos, **options)  # the default coding (full) is what collect recorded by default: read as is
    fp = data.fingerprint
    assert not set(fp["train_seeds"]) & (set(fp["val_seeds"]) | set(fp["test_seeds"]))  # split by episode
    assert set(data.train.seeds) == set(fp["train_seeds"])
    reader = Demonstrations(demos)
    assert reader.frame_coding == "full" and fp["frame_coding"] == "full"
    first = reader.load(fp["train_seeds"][0])
    for t in (0, 1, 7, EPISODE_STEPS - 1):
        x, y = data.train[t]
        assert x.dtype == torch.uint8 and x.shape == (4, 84, 84)
        assert np.array_equal(x.numpy(), first.stack(t))
        assert np.allclose(y.numpy(), first.label[t])  # the clean expert label ...
    assert not np.allclose(first.label, first.action)  # ... not the DART-noised executed action
    assert np.array_equal(first.stack(7)[-1], code_full(first.raw[7]))
    assert data.encoder.kind == "frames" and data.encoder.n_tokens == 4 and data.out_dim == 3
    motion = build(demos, **{**options, "input": "motion"})
    x, _ = motion.train[7]
    assert np.array_equal(x.numpy(), motion_stack(torch.as_tensor(first.stack(7))).numpy())
    assert motion.fingerprint["input"] == "motion"
    # another coding than the recorded one: re-coded from the raw frames, the first repeated like the reset stack
    cropped = build(demos, **{**options, "frame_coding": "cropped"})
    coded = [code_cropped(first.raw[t]) for t in (0, 0, 0, 0, 1, 2)]
    assert np.array_equal(cropped.train[0][0].numpy(), np.stack(coded[:4]))
    assert np.array_equal(cropped.train[2][0].numpy(), np.stack(coded[2:6]))
    assert cropped.fingerprint["frame_coding"] == "cropped"
    with pytest.raises(ValueError, match="task.input='optical-flow'"):
        build(demos, input="optical-flow")
    with pytest.raises(ValueError, match="no field 'strid'"):
        build(demos, strid=2)
    strided = build(demos, stride=2, test_fraction=0.2)
    assert len(strided.train) == pytest.approx(len(data.train) / 2, abs=2)
    rebuilt = tasks.rebuild(data.fingerprint)
    assert torch.equal(rebuilt.test.frames, data.test.frames) and torch.equal(rebuilt.val.labels, data.val.labels)


def test_other_coding_without_raw_frames_is_refused_with_the_fix(tmp_path):
    out = tmp_path / "noraw"
    assert main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-2", "--out", str(out),
                 "--max-episode-steps", "20", "--min-return", "-1000", "--no-progress"]) == 0  # fmt: skip
    build(out, val_fraction=0.34, test_fraction=0.34)  # default coding: no raw frames needed
    with pytest.raises(ValueError, match="task.frame_coding=full or record with --frame-coding cropped"):
        build(out, val_fraction=0.34, test_fraction=0.34, frame_coding="cropped")


def test_motion_stack_is_the_newest_frame_and_successive_differences():
    frames = torch.tensor([10, 30, 25, 255], dtype=torch.uint8).view(4, 1, 1).expand(4, 2, 3)  # (k, H, W)
    coded = motion_stack(frames)
    assert coded.dtype == torch.uint8 and coded.shape == frames.shape
    assert coded[:, 0, 0].tolist() == [255, 128 + 115, 128 - 3, 128 + 10]  # f3; (f3-f2)/2; (f2-f1)/2; (f1-f0)/2
    # invertible up to the halved last bit: rebuild the stack from the newest frame backwards
    rebuilt = [coded[0, 0, 0].item()]
    for j in range(1, 4):
        rebuilt.append(rebuilt[-1] - 2 * (coded[j, 0, 0].item() - 128))
    assert np.allclose(rebuilt[::-1], [10, 30, 25, 255], atol=3)
    batch = torch.stack([frames, frames.flip(0)])  # (B, k, H, W)
    assert torch.equal(motion_stack(batch)[1], motion_stack(frames.flip(0)))
    assert torch.equal(motion_stack(frames[None].expand(4, 4, 2, 3)[0]), coded)
    still = torch.full((4, 2, 2), 77, dtype=torch.uint8)  # reset observation: the first frame repeated
    assert motion_stack(still)[1:].eq(128).all()


def test_collect_train_eval_replay(demos, tmp_path):
    run = tmp_path / "run"
    code = main(["train", "--controller", "nsac", "--data", str(demos), "--out", str(run), "--epochs", "2",
                 "--batch-size", "32", "--no-progress", "--set", "encoder.d_model=16", "n_heads=2",
                 "task.val_fraction=0.2", "task.test_fraction=0.2"])  # fmt: skip
    assert code == 0
    report = json.loads((run / "metrics.json").read_text())
    for key in ("mse", "nll", "crps", "ece", "coverage_90", "width_90"):
        assert np.isfinite(report["test"][key]), key
        for action in ("steer", "gas", "brake"):
            assert np.isfinite(report["test"]["per_action"][action][key])
    # any checkpoint of the run (here best.pt again) gets the same offline report from its fingerprint alone
    from drive import checkpoint

    model, payload = checkpoint.load_controller(run / "best.pt")
    again = tasks.rebuild(payload["data"]).evaluate(model)["test"]
    assert again["mse"] == pytest.approx(report["test"]["mse"], rel=1e-6)
    assert again["per_action"]["steer"]["nll"] == pytest.approx(report["test"]["per_action"]["steer"]["nll"], rel=1e-6)
    # normalisation fitted on the training episodes only, saved with the weights
    train_seeds = report["test"] and json.loads((run / "config.json").read_text())["data"]["train_seeds"]
    labels = np.concatenate([Demonstrations(demos).load(s).label for s in train_seeds])
    ckpt = torch.load(run / "best.pt", weights_only=True)
    np.testing.assert_allclose(ckpt["state_dict"]["y_loc"].numpy(), labels.mean(0), rtol=1e-4, atol=1e-5)

    # the closed-loop policy feeds the controller exactly what training fed it: the recorded stack, coded once
    policy = load_controller_policy(run / "best.pt", samples=4, shadow=None, env="fake-road")
    assert policy.coder.coding == "full"
    episode = Demonstrations(demos).load(train_seeds[0])
    policy.reset(seed=0)
    for t in range(6):
        policy.generator.manual_seed(5)
        pred, _, _ = policy.predict(episode.raw[t])
    with torch.inference_mode():
        x = torch.as_tensor(episode.stack(5))[None]  # (1, 4, 84, 84): the training input of step 5
        expected = policy.model.predict(x, 4, torch.Generator().manual_seed(5))
    np.testing.assert_allclose(pred.mean, expected.mean[0].numpy(), rtol=1e-5, atol=1e-6)

    out = tmp_path / "eval.json"
    trace_dir = tmp_path / "traces"
    code = main(["eval", "--ckpt", str(run / 'best.pt'), "--env", "fake-road", "--seeds", "100-101",
                 "--max-episode-steps", str(EVAL_STEPS), "--out", str(out), "--trace", str(trace_dir),
                 "--fallback", "expert", "--calibrate-seeds", "200", "--samples", "8", "--no-progress"])  # fmt: skip
    assert code == 0
    results = json.loads(out.read_text())
    assert '"/' not in out.read_text() and results["policy"].startswith("ckpt:../")  # no path of this machine
    for key in ("mean_return", "std_return", "min_return", "coverage90_steer", "coverage50_steer", "nll_expert",
                "latency_ms_p50", "latency_ms_p95", "mean_return_no_fallback", "n_interventions"):  # fmt: skip
        assert key in results and np.isfinite(results[key]), key
    assert 0 <= results["coverage50_steer"] <= results["coverage90_steer"] <= 1
    assert results["fallback"]["threshold"] > 0
    assert len(results["episodes"]) == len(results["episodes_no_fallback"]) == 2
    for record in results["episodes"]:
        for key in ("seed", "return", "tiles", "off_track_events", "steps", "coverage90_steer", "latency_ms_p95",
                    "return_no_fallback", "n_interventions"):  # fmt: skip
            assert key in record, key
    assert results["mean_return"] == pytest.approx(np.mean([r["return"] for r in results["episodes"]]))

    trace = trace_dir / "trace_seed000100.parquet"
    table, meta = read_trace(trace)
    steps = results["episodes"][0]["steps"]
    assert table.num_rows == steps
    for column in ("kappa", "phi", "psi", "mu", "sigma2", "kappa_h0", "kappa_h1", "mean_steer", "epistemic_var_steer",
                   "expert_steer", "fallback", "x", "y", "track_pos", "frame"):  # fmt: skip
        assert column in table.column_names, column
    assert set(table.column("fallback").to_pylist()) <= {"controller", "expert"}

    video = tmp_path / "replay.mp4"
    assert main(["replay", str(trace), "--out", str(video)]) == 0
    assert len(read_video(video)) == steps


def test_dagger_aggregates_expert_labelled_clone_episodes(demos, tmp_path):
    from agents.encoders import EncoderConfig
    from agents.nsac import NSACConfig
    from agents.registry import config_to_dict
    from drive import checkpoint
    from drive.loop.dagger import DaggerOptions as Config
    from drive.loop.dagger import aggregate as _aggregate
    from drive.observe.demonstrations import recorder_for
    from sim_bridges.fake_road import FakeRoadDriver

    def aggregate(options):
        return _aggregate(options, recorder_for)

    torch.manual_seed(0)
    cfg = NSACConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=2)
    ckpt = tmp_path / "clone.pt"
    checkpoint.save(ckpt, kind="controller", name="nsac", config=config_to_dict(cfg), module=cfg.build())
    out = tmp_path / "agg"
    run = Config(ckpt=ckpt, data=demos, out=out, seeds="50-51", beta=0.5, workers=1, max_episode_steps=40,
                 env="fake-road", progress=False)  # fmt: skip
    aggregate(run)
    data = Demonstrations(out)
    assert data.seeds == [0, 1, 2, 3, 4, 5, 50, 51]
    assert np.array_equal(data.load(3).label, Demonstrations(demos).load(3).label)  # originals carried over
    new = data.load(50)
    assert new.meta["dagger"] and new.raw is not None and len(new) == 40
    expert = FakeRoadDriver()
    labels = np.stack([expert.act(state) for state in new.state])
    np.testing.assert_allclose(new.label, labels, atol=1e-6)  # the expert labels every visited state
    executed_expert = np.all(np.isclose(new.action, np.clip(new.label, [-1, 0, 0], [1, 1, 1])), axis=1)
    assert 0.2 < executed_expert.mean() < 0.8  # beta = 0.5: the clone drives about half the steps
    from datasets.regenerate import require_episodes
    from drive.learn.tasks.demos import Options as DemosOptions
    from drive.learn.tasks.demos import _fingerprint

    fp = _fingerprint(data, {"test": [3, 50]}, DemosOptions())
    assert fp["dagger_seeds"] == [50, 51]  # a regeneration by `drive collect` is named for seed 3 alone
    with pytest.raises(DemonstrationError, match=r"--seeds 3 --out DIR` regenerates them; episodes 50 were .*dagger"):
        require_episodes(tmp_path / "elsewhere", [3, 50], fp)
    manifest = (out / "manifest.json").read_bytes()
    assert aggregate(run) == [] and (out / "manifest.json").read_bytes() == manifest  # rerun: complete, kept
    with pytest.raises(ValueError, match="holds another dataset.*beta"):
        aggregate(dataclasses.replace(run, beta=0.4))
    shard = out / data.episodes[0]["file"]  # a corrupt source is refused before anything is linked or written
    bad = tmp_path / "bad"
    shutil.copytree(demos, bad)
    src = bad / data.episodes[0]["file"]
    src.write_bytes(src.read_bytes()[:100] + bytes(len(src.read_bytes()) - 100))
    with pytest.raises(DemonstrationError, match=src.name):
        aggregate(dataclasses.replace(run, data=bad, out=tmp_path / "from-bad"))
    assert not (tmp_path / "from-bad").exists() and shard.is_file()
    with pytest.raises(ValueError, match="already in"):
        aggregate(Config(ckpt=ckpt, data=demos, out=tmp_path / "b", seeds="5-6", env="fake-road", progress=False))
    lanes = aggregate(dataclasses.replace(run, out=tmp_path / "lanes", seeds="50-52", envs=2))  # 2 cars per process
    ref = aggregate(dataclasses.replace(run, out=tmp_path / "one", seeds="50-52"))
    assert [r["sha256"] for r in lanes] == [r["sha256"] for r in ref] and len(ref) == 3
