"""`drive eval` (JSON fields, summaries, parallel = serial, policy specs), the video writer and `drive demo`."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from datasets.demonstrations import Demonstrations
from drive.cli import main
from drive.commands.eval import Config
from drive.loop.envs import make_env
from drive.loop.evaluate import describe, evaluate
from drive.loop.policies import ExpertPolicy
from drive.loop.rollout import rollout
from drive.loop.specs import POLICY_KINDS, make_policy, parse_policy_spec
from drive.loop.specs import expert_policy as load_expert_policy
from drive.observe.video import VideoError, VideoWriter, read_video, video_fps


def test_eval_json_has_per_episode_records_and_summary(tmp_path, capsys):
    out = tmp_path / "eval.json"
    code = main(
        [
            "eval",
            "--expert",
            "pursuit",
            "--env",
            "fake-road",
            "--seeds",
            "3-5",
            "--max-episode-steps",
            "90",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert "mean_return" in capsys.readouterr().out
    results = json.loads(out.read_text())
    assert [r["seed"] for r in results["episodes"]] == [3, 4, 5]
    for record in results["episodes"]:
        for key in ("return", "completion", "steps", "tiles", "off_track_events", "lap_finished"):
            assert key in record
        assert record["steps"] == 90 and 0 < record["completion"] < 1
    returns = np.array([r["return"] for r in results["episodes"]])
    assert results["mean_return"] == pytest.approx(returns.mean())
    assert results["std_return"] == pytest.approx(returns.std())
    assert results["min_return"] == pytest.approx(returns.min())
    assert results["n_episodes"] == 3 and results["policy"] == "expert:pursuit" and results["seeds"] == [3, 4, 5]
    # the records are the closed loop's own results
    direct = rollout(make_env("fake-road", max_episode_steps=90), make_policy("expert:pursuit", "fake-road"), seeds=[4])
    assert results["episodes"][1]["return"] == pytest.approx(direct[0].return_)


def test_parallel_eval_equals_serial():
    cfg = dict(policy="expert:pursuit", env="fake-road", seeds="0-3", max_episode_steps=60, progress=False)
    serial, parallel = evaluate(Config(**cfg, workers=1)), evaluate(Config(**cfg, workers=2))
    strip = lambda res: [{k: v for k, v in r.items() if k != "wall_s"} for r in res["episodes"]]  # noqa: E731
    assert strip(serial) == strip(parallel)
    assert serial["mean_return"] == parallel["mean_return"]


def test_policy_specs():
    assert parse_policy_spec("expert:ppo") == ("expert", "ppo")
    assert isinstance(make_policy("expert:pursuit", "fake-road"), ExpertPolicy)
    for bad in ("ppo", "expert:", "nonsense:x"):
        with pytest.raises(ValueError, match="expected KIND:ARG"):
            parse_policy_spec(bad)
    assert set(POLICY_KINDS) >= {"expert"}
    assert main(["eval", "--expert", "no-such-expert", "--env", "fake-road", "--seeds", "0"]) == 2
    assert main(["eval", "--expert", "pursuit", "--ckpt", "x.pt", "--env", "fake-road", "--seeds", "0"]) == 2


def test_expert_eval_in_state_mode_matches_the_pixel_env():
    # experts never look at pixels, so eval runs CarRacing in its state-only mode: same physics, same reward
    policy = load_expert_policy("pursuit")
    assert policy.needs_pixels is False
    state_env = make_env("carracing", pixels=False, max_episode_steps=40)
    pixel_env = make_env("carracing", pixels=True, max_episode_steps=40)
    [a], [b] = rollout(state_env, policy, seeds=[11]), rollout(pixel_env, policy, seeds=[11])
    assert a.return_ == b.return_ and a.completion == b.completion and a.steps == b.steps == 40


def test_video_round_trip(tmp_path):
    path = tmp_path / "v.mp4"
    rng = np.random.default_rng(0)
    frames = [np.full((64, 96, 3), (40 * i % 256, 100, 200), np.uint8) for i in range(12)]
    with VideoWriter(path, fps=25) as video:
        for frame in frames:
            video.write(frame)
    back = read_video(path)
    assert back.shape == (12, 64, 96, 3)
    assert video_fps(path) == pytest.approx(25)
    # lossy codec: colours survive approximately, and in RGB order
    assert np.abs(back.astype(int) - np.stack(frames).astype(int)).mean() < 8
    with pytest.raises(ValueError, match="differs from the first frame"):
        with VideoWriter(tmp_path / "w.mp4") as video:
            video.write(frames[0])
            video.write(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
    assert not (tmp_path / "w.mp4").exists() and not list(tmp_path.glob(".*tmp*"))
    with pytest.raises(VideoError, match="cannot open"):
        read_video(tmp_path / "missing.mp4")


def test_demo_records_demonstrations_and_a_video(tmp_path, capsys):
    out = tmp_path / "demo"
    code = main(
        [
            "demo",
            "--out",
            str(out),
            "--env",
            "fake-road",
            "--expert",
            "pursuit",
            "--episodes",
            "2",
            "--seeds",
            "0-1",
            "--workers",
            "1",
            "--max-episode-steps",
            "70",
            "--video-steps",
            "50",
            "--scale",
            "2",
            "--no-progress",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert str(out / "expert.mp4") in printed and str(out / "demonstrations") in printed
    ds = Demonstrations(out / "demonstrations", include_flagged=True)
    assert ds.seeds == [0, 1] and ds.load(0).raw is not None
    video = read_video(out / "expert.mp4")
    assert video.shape == (50, 192, 192, 3)
    # rerunning resumes: nothing recorded again
    assert (
        main(
            [
                "demo",
                "--out",
                str(out),
                "--env",
                "fake-road",
                "--expert",
                "pursuit",
                "--episodes",
                "2",
                "--seeds",
                "0-1",
                "--max-episode-steps",
                "70",
                "--video-steps",
                "50",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "already recorded" in capsys.readouterr().out


def test_describe_names_failure_events_in_words_and_says_when_there_is_nothing_to_score():
    quiet = {"horizon": 25, "events": {"off_track": 0, "spin": 0, "stall": 0},
             "signals": {"epistemic_steer": {"auroc": None, "median_lead_steps": None}}}  # fmt: skip
    text = describe({"failure_prediction": quiet})
    assert "events: off_track 0, spin 0, stall 0" in text and "nothing to score" in text
    assert "{" not in text and "AUROC -" not in text
    scored = {**quiet, "events": {"off_track": 2, "spin": 0, "stall": 1},
              "signals": {"epistemic_steer": {"auroc": 0.8125, "median_lead_steps": 12.0},
                          "total_steer": {"auroc": 0.5, "median_lead_steps": None}}}  # fmt: skip
    text = describe({"failure_prediction": scored})
    assert "epistemic_steer AUROC 0.812, median lead 12 steps" in text
    assert "total_steer AUROC 0.500, median lead n/a" in text


def test_each_progress_bar_says_which_phase_it_counts(tmp_path, monkeypatch):
    # a controller with a fallback and failure prediction runs three bars; the last used to read "nominal 5/5"
    import torch

    from agents.encoders import EncoderConfig
    from agents.nsac import NSACConfig
    from agents.registry import config_to_dict
    from drive import checkpoint
    from drive.loop import evaluate as evaluate_module
    from drive.loop.options import EvalOptions

    torch.manual_seed(0)
    cfg = NSACConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=2)
    path = tmp_path / "nsac.pt"
    checkpoint.save(path, kind="controller", name="nsac", config=config_to_dict(cfg), module=cfg.build())
    labels, run_tasks = [], evaluate_module.run_tasks

    def spy(*args, label, **kwargs):
        labels.append(label)
        return run_tasks(*args, label=label, **kwargs)

    monkeypatch.setattr(evaluate_module, "run_tasks", spy)
    opts = EvalOptions(policy=f"ckpt:{path}", seeds="7", max_episode_steps=8, samples=2, shadow="pursuit",
                       fallback="expert", fallback_threshold=1.0, calibrate_seeds="8", failure_horizon=5,
                       progress=False)  # fmt: skip
    evaluate(opts)
    assert labels == ["eval, fallback on", "eval, fallback off", "alarm calibration laps"]
    assert evaluate_module.phase_label("") == "eval"  # no fallback: one bar, the seeds
    assert max(len(label) for label in labels) <= 22  # the bar, counts and frames/s still fit 80 columns


def test_a_study_that_pairs_the_twins_itself_drives_only_the_gated_episodes(tmp_path):
    """`fallback_twin=False` (what `drive bench generalisation` sets): the gated episodes alone, and the ungated
    twins a study pairs them with are the episodes of the same run with the fallback off, to the bit."""
    import torch

    from agents.encoders import EncoderConfig
    from agents.nsac import NSACConfig
    from agents.registry import config_to_dict
    from drive import checkpoint
    from drive.loop.options import EvalOptions

    torch.manual_seed(0)
    cfg = NSACConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=2)
    path = tmp_path / "nsac.pt"
    checkpoint.save(path, kind="controller", name="nsac", config=config_to_dict(cfg), module=cfg.build())
    base = EvalOptions(policy=f"ckpt:{path}", seeds="7,9", max_episode_steps=12, samples=2, shadow="none",
                       failure_horizon=5, calibrate_seeds="8", progress=False)  # fmt: skip
    paired = evaluate(replace(base, fallback="slow", fallback_threshold=1e-9))
    alone = evaluate(replace(base, fallback="slow", fallback_threshold=1e-9, fallback_twin=False))
    plain = evaluate(replace(base, failure_horizon=0))
    assert "episodes_no_fallback" not in alone and not any(k.startswith("failure_prediction") for k in alone)

    def driven(episodes):  # timings, failure events and the pairing itself aside
        skip = ("latency", "wall", "events", "return_no_fallback")
        return [{k: v for k, v in e.items() if not k.startswith(skip)} for e in episodes]

    assert driven(alone["episodes"]) == driven(paired["episodes"])
    assert driven(paired["episodes_no_fallback"]) == driven(plain["episodes"])
    assert any(e["n_interventions"] for e in alone["episodes"])  # the gate did engage: the runs are not the same
