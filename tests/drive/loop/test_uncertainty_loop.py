"""Camera perturbations (frame functions, the closed-loop wrapper, CarRacing's recolouring), failure events and
their prediction report, the blended fallback and its option string, uncertainty-gated DAgger."""

from __future__ import annotations

import math

import numpy as np
import pytest

from drive.errors import UserError
from drive.loop.failures import SIGNALS, FailureMonitor, _lead_times, failure_report, nominal_thresholds
from drive.loop.fallback import FallbackConfig, FallbackGate, parse_fallback
from drive.perturb.camera import FramePerturber, Perturbation, domain_colours, parse_perturbation, parse_perturbations
from drive.perturb.wrappers import PerturbedCamera

pytestmark = pytest.mark.usefixtures("one_thread")


def _frame(seed=0):
    return np.random.default_rng(seed).integers(40, 216, (96, 96, 3), dtype=np.uint8)


def test_perturbation_specs_parse_and_refuse_bad_levels():
    assert parse_perturbations("noise:0.1, blur:2,domain_randomize") == (
        Perturbation("noise", 0.1), Perturbation("blur", 2.0), Perturbation("domain_randomize"))  # fmt: skip
    assert str(parse_perturbation("occlusion:0.25")) == "occlusion:0.25"
    for bad in ("noise", "noise:2", "blur:-1", "occlusion:1", "fog:1", "domain_randomize:1", "noise:x"):
        with pytest.raises(ValueError):
            parse_perturbation(bad)


def test_frame_perturbations_have_their_stated_size_and_replay_per_episode():
    frame = _frame()
    noisy = FramePerturber(Perturbation("noise", 0.05), seed=1)
    noisy.reset(7)
    diff = noisy(frame).astype(float) - frame
    assert diff.std() == pytest.approx(0.05 * 255, rel=0.03)  # std in [0, 1] pixel units
    noisy.reset(7)
    assert np.array_equal(noisy(frame).astype(float) - frame, diff)  # same episode seed, same noise
    occl = FramePerturber(Perturbation("occlusion", 0.1), seed=1)
    occl.reset(3)
    covered = (occl(np.full_like(frame, 200)) == 0).all(-1).mean()
    assert covered == pytest.approx(0.1, abs=0.01)
    first = occl(frame)
    assert np.array_equal(occl(frame), first)  # the patch stays put during an episode
    bright = FramePerturber(Perturbation("brightness", 0.5))
    np.testing.assert_allclose(bright(frame), np.rint(frame * 0.5), atol=1)
    blur = FramePerturber(Perturbation("blur", 2.0))(frame)
    assert blur.std() < frame.std() / 3  # iid pixels: a sigma-2 blur removes most of the variation
    assert np.array_equal(FramePerturber(Perturbation("blur", 0.0))(frame), frame)


def test_domain_colours_follow_carracing():
    road, bg, grass = domain_colours(np.random.default_rng(0))
    assert ((0 <= road) & (road < 210)).all() and ((0 <= bg) & (bg < 210)).all()
    assert np.count_nonzero(grass - bg) == 1 and np.isclose((grass - bg).sum(), 20)


def test_perturbed_camera_recolours_the_seeds_own_track():
    from drive.loop.envs import make_env

    clean = make_env("carracing", max_episode_steps=5)
    wrapped = PerturbedCamera(make_env("carracing", max_episode_steps=5), Perturbation("domain_randomize"), seed=2)
    obs_c, info_c = clean.reset(seed=11)
    obs_w, info_w = wrapped.reset(seed=11)
    np.testing.assert_array_equal(info_c["state"], info_w["state"])  # the same track and car: the world is intact
    road = wrapped.unwrapped.road_color
    assert not np.allclose(road, [102, 102, 102])
    assert np.abs(obs_c.astype(int) - obs_w).mean() > 10  # colours changed where the road and grass are
    assert np.array_equal(obs_c[-12:], obs_w[-12:])  # the indicator bar is not part of the world
    for _ in range(3):
        obs_c, *_, info_c = clean.step(np.array([0.0, 0.5, 0.0]))
        obs_w, *_, info_w = wrapped.step(np.array([0.0, 0.5, 0.0]))
    np.testing.assert_array_equal(info_c["state"], info_w["state"])
    assert all(np.allclose(t.color - road, np.round((t.color - road) / 2.55) * 2.55) for t in wrapped.unwrapped.road)


class _Rec:
    def __init__(self, t, info, epi=0.0):
        from drive.loop.rollout import PolicyOutput, StepPrediction

        self.t, self.next_info = t, info
        pred = StepPrediction(np.zeros(3), np.full(3, 0.1), np.array([epi, 0.0, 0.0]))
        self.output = PolicyOutput(np.zeros(3), prediction=pred)


def _info(off=False, heading=0.0, speed=10.0):
    state = np.zeros(10, np.float32)
    state[4] = heading
    return {"off_track": off, "speed": speed, "state": state}


def test_failure_monitor_finds_off_track_spin_and_stall_onsets():
    mon = FailureMonitor(heading_index=4)
    infos = [_info()] * 60 + [_info(off=True)] * 5 + [_info()] * 5 + [_info(heading=2.0)] * 5 + [_info()] * 5
    infos += [_info(speed=0.2)] * 25 + [_info()] * 3
    for t, info in enumerate(infos):
        mon(_Rec(t, info))
    ep = mon.episode_traces()
    assert [(e["kind"], e["t"]) for e in ep["events"]] == [("off_track", 60), ("spin", 70), ("stall", 80)]
    assert ep["signals"].shape == (len(infos), len(SIGNALS))
    assert not ep["busy"][60] and ep["busy"][61] and not ep["busy"][66]  # busy: already in the event


def test_failure_report_scores_a_signal_that_warns_before_events():
    rng = np.random.default_rng(0)
    episodes = []
    for k in range(4):
        sig = rng.uniform(0, 1, (300, len(SIGNALS)))
        onset = 100 + 30 * k
        sig[onset - 15 : onset + 1, 0] += 5.0  # epistemic_steer rises 15 steps before the event
        episodes.append({"events": [{"kind": "off_track", "t": onset}], "signals": sig, "busy": np.zeros(300, bool)})
    thresholds = nominal_thresholds(rng.uniform(0, 1, (1000, len(SIGNALS))), 0.99)
    report = failure_report(episodes, thresholds, horizon=25)
    first, other = report["signals"]["epistemic_steer"], report["signals"]["aleatoric_steer"]
    assert first["auroc"] > 0.75 and abs(other["auroc"] - 0.5) < 0.1
    assert first["median_lead_steps"] == 15 and first["detected"] == 4 and first["n_events"] == 4
    assert report["events"]["off_track"] == 4
    leads, missed, false = _lead_times(np.array([0, 1, 1, 0, 0, 0, 0, 0, 1, 0], bool), [5], horizon=4)
    assert (leads, missed, false) == ([4], 0, 1)


def test_blended_fallback_ramps_the_controls_and_the_option_string():
    cfg = parse_fallback("expert:blend_steps=4,engage_steps=1,min_hold_steps=2,release_steps=1")
    assert cfg == FallbackConfig(mode="expert", blend_steps=4, engage_steps=1, min_hold_steps=2, release_steps=1)
    assert parse_fallback("off") is None and parse_fallback("slow").mode == "slow"
    for bad in ("expert:nope=1", "expert:blend_steps=x", "expert:mode=slow", "fly"):
        with pytest.raises(UserError):
            parse_fallback(bad)
    gate = FallbackGate(1.0, cfg)
    ctrl, expert = np.array([0.0, 1.0, 0.0], np.float32), np.array([1.0, 0.0, 0.0], np.float32)
    steer = []
    for score in [2.0] * 6 + [0.0] * 6:
        gate.update(score)
        steer.append(float(gate.apply(ctrl, expert)[0]))
    np.testing.assert_allclose(steer, [0.25, 0.5, 0.75, 1, 1, 1, 0.75, 0.5, 0.25, 0, 0, 0])  # released at once
    assert math.isclose(FallbackGate(1.0, FallbackConfig(engage_steps=1)).weight, 0.0)


def test_gated_dagger_labels_only_uncertain_states_and_training_skips_the_rest(tmp_path):
    import torch

    from agents.encoders import EncoderConfig
    from agents.nsac import NSACConfig
    from agents.registry import config_to_dict
    from datasets.demonstrations import Demonstrations
    from drive import checkpoint
    from drive.cli import main
    from drive.learn import tasks
    from drive.loop.dagger import DaggerOptions, aggregate
    from drive.observe.demonstrations import recorder_for

    demos = tmp_path / "demos"
    assert main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-3", "--out", str(demos),
                 "--max-episode-steps", "30", "--min-return", "-1000", "--no-progress"]) == 0  # fmt: skip
    torch.manual_seed(0)
    cfg = NSACConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=2)
    ckpt = tmp_path / "clone.pt"
    checkpoint.save(ckpt, kind="controller", name="nsac", config=config_to_dict(cfg), module=cfg.build())
    plain = aggregate(DaggerOptions(ckpt=ckpt, data=demos, out=tmp_path / "plain", seeds="50-51", beta=0.3, workers=1,
                                    max_episode_steps=30, env="fake-road", progress=False), recorder_for)  # fmt: skip
    counts = {}
    for q in (0.0, 1e9):
        out = tmp_path / f"gated{q:g}"
        gated = aggregate(DaggerOptions(ckpt=ckpt, data=demos, out=out, seeds="50-51", beta=0.3, workers=1,
                                        max_episode_steps=30, env="fake-road", progress=False, query_threshold=q),
                          recorder_for)  # fmt: skip
        assert [r["labels"] for r in plain] == [30, 30]
        ep = Demonstrations(out).load(50)
        labelled = np.isfinite(ep.label).all(1)
        assert labelled.sum() == gated[0]["labels"]
        assert Demonstrations(out).manifest["settings"]["dagger"]["query_threshold"] == q
        counts[q] = int(labelled.sum())
    assert counts == {0.0: 30, 1e9: 0}  # every state is uncertain above 0; nothing is queried above 1e9
    data = tasks.load("demos", tasks.options("demos", {"val_fraction": "0.2", "test_fraction": "0.2"}), out, 0)
    assert torch.isfinite(data.train.labels).all() and torch.isfinite(data.val.labels).all()


def test_robustness_sweep_points_share_the_clean_run():
    from drive.commands.bench.robustness import points

    grid = points(("noise:0.05,0.1", "brightness:0.5", "domain_randomize"))
    assert grid == [("noise", 0.0, ""), ("noise", 0.05, "noise:0.05"), ("noise", 0.1, "noise:0.1"),
                    ("brightness", 1.0, ""), ("brightness", 0.5, "brightness:0.5"),
                    ("domain_randomize", 0.0, ""), ("domain_randomize", 1.0, "domain_randomize")]  # fmt: skip
    with pytest.raises(UserError):
        points(("noise:3",))
