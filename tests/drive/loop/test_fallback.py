"""Uncertainty-gated fallback: calibration, hysteresis, hand-over, counting — and inside the closed loop."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from agents.base import Controller
from datasets.frames import ObservationCoder
from drive.loop.envs import make_env
from drive.loop.fallback import FallbackConfig, FallbackGate, calibrate_threshold, score
from drive.loop.policies import ControllerPolicy
from drive.loop.rollout import rollout
from sim_bridges.fake_road import FakeRoadDriver


def test_threshold_is_the_quantile_of_nominal_scores():
    rng = np.random.default_rng(0)
    scores = rng.exponential(size=5000)
    assert calibrate_threshold(scores, 0.99) == pytest.approx(np.quantile(scores, 0.99))
    # by construction about 1 % of nominal steps exceed it
    assert np.mean(scores > calibrate_threshold(scores, 0.99)) == pytest.approx(0.01, abs=0.002)
    with pytest.raises(ValueError, match="no finite scores"):
        calibrate_threshold(np.array([np.nan]), 0.9)


def test_score_picks_the_signal():
    epi = np.array([0.1, 0.02, 0.003])
    assert score(epi, "steer") == pytest.approx(0.1)
    assert score(epi, "brake") == pytest.approx(0.003)
    assert score(epi, "sum") == pytest.approx(0.123)


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="mode"):
        FallbackConfig(mode="panic")
    with pytest.raises(ValueError, match="quantile"):
        FallbackConfig(quantile=1.5)
    with pytest.raises(ValueError, match="threshold"):
        FallbackGate(float("nan"))


def test_hysteresis_engages_holds_and_releases():
    cfg = FallbackConfig(engage_steps=2, release_ratio=0.5, release_steps=3, min_hold_steps=4)
    gate = FallbackGate(1.0, cfg)
    # a single spike does not engage
    assert [gate.update(v) for v in (2.0, 0.1, 0.1)] == [False, False, False]
    # two consecutive steps above engage at the second
    assert gate.update(1.5) is False
    assert gate.update(1.5) is True
    # between the release level (0.5) and the threshold the gate holds
    assert all(gate.update(0.8) for _ in range(10))
    # below the release level it releases only after release_steps consecutive steps
    assert [gate.update(0.1) for _ in range(3)] == [True, True, False]
    assert gate.update(0.1) is False
    summary = gate.summary()
    assert summary["n_interventions"] == 1
    assert summary["interventions"][0]["start"] == 4
    assert summary["interventions"][0]["end"] == 17
    assert summary["interventions"][0]["peak_score"] == pytest.approx(1.5)
    assert summary["fallback_steps"] == 13
    gate.reset()
    assert gate.summary()["n_interventions"] == 0


def test_min_hold_keeps_the_gate_engaged():
    gate = FallbackGate(1.0, FallbackConfig(engage_steps=1, release_steps=1, min_hold_steps=5))
    assert gate.update(2.0)
    assert [gate.update(0.0) for _ in range(5)] == [True, True, True, True, False]


def test_apply_hands_over_or_slows_down():
    action, expert = np.array([0.3, 0.9, 0.0], np.float32), np.array([-0.2, 0.4, 0.0], np.float32)
    gate = FallbackGate(1.0, FallbackConfig(mode="expert", engage_steps=1))
    assert np.array_equal(gate.apply(action, expert), action)  # not engaged
    gate.update(5.0)
    assert np.array_equal(gate.apply(action, expert), expert)
    slow = FallbackGate(1.0, FallbackConfig(mode="slow", engage_steps=1, slow_gas=0.1, slow_brake=0.2))
    slow.update(5.0)
    out = slow.apply(action, None)
    assert out[0] == pytest.approx(0.3) and out[1] == pytest.approx(0.1) and out[2] == pytest.approx(0.2)


class _Uncertain(Controller):
    """A controller whose samples disagree by a settable amount: epistemic var of steer = spread**2."""

    default_samples = 8

    def __init__(self):
        super().__init__(out_dim=3)
        self.spread = 0.0

    def _moments(self, x, samples, generator):
        b = x.shape[0]
        signs = torch.tensor([1.0, -1.0]).repeat(samples // 2)[:, None, None]  # (S, 1, 1)
        mu = torch.zeros(samples, b, 3)
        mu[..., 0:1] = signs * self.spread
        mu[..., 1] = 0.3
        return mu, torch.full((samples, b, 3), 0.01)


def test_fallback_in_the_closed_loop_hands_control_to_the_shadow_expert():
    model = _Uncertain()
    expert = FakeRoadDriver()
    gate = FallbackGate(0.01, FallbackConfig(mode="expert", engage_steps=1, min_hold_steps=1, release_steps=1))
    policy = ControllerPolicy(model, ObservationCoder("full", "frames", 4), samples=8, shadow=expert, gate=gate)
    env = make_env("fake-road", max_episode_steps=40)
    seen = []

    def flip(record):
        seen.append((record.t, record.source, record.action.copy(), record.output.expert))
        assert record.output.gate is not None and record.output.gate.engaged == (record.source == "expert")
        model.spread = 0.5 if 10 <= record.t < 20 else 0.0  # uncertain for the next steps

    rollout(env, policy, seeds=[3], on_step=flip)
    for t, source, action, expert_action in seen:
        if 11 <= t <= 20:
            assert source == "expert" and np.allclose(action, np.clip(expert_action, [-1, 0, 0], [1, 1, 1]))
        elif t < 11:
            assert source == "policy" and action[0] == pytest.approx(0.0)
    summary = policy.episode_summary()
    assert summary["n_interventions"] == 1
    assert summary["fallback_steps"] == 10
    assert 0.0 <= summary["coverage90_steer"] <= 1.0
    assert summary["latency_ms_p95"] >= summary["latency_ms_p50"] > 0


def test_threshold_comes_from_the_argument_the_checkpoint_or_nominal_laps(tmp_path):
    from agents.encoders import EncoderConfig
    from agents.nsac import NSACConfig
    from agents.registry import config_to_dict
    from drive import checkpoint
    from drive.loop.thresholds import resolve_threshold

    torch.manual_seed(0)
    cfg = NSACConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=2)
    model = cfg.build()
    plain, stored = tmp_path / "plain.pt", tmp_path / "stored.pt"
    checkpoint.save(plain, kind="controller", name="nsac", config=config_to_dict(cfg), module=model)
    fb = {"threshold": 0.0123, "signal": "steer", "quantile": 0.99, "n_samples": 32, "seeds": [7]}
    checkpoint.save(stored, kind="controller", name="nsac", config=config_to_dict(cfg), module=model,
                    extra={"fallback": fb})  # fmt: skip
    env = {"name": "fake-road", "max_episode_steps": 30}
    assert resolve_threshold(plain, FallbackConfig(), 0.5, env_kwargs=env) == (0.5, "given")
    value, origin = resolve_threshold(stored, FallbackConfig(), env_kwargs=env)
    assert value == pytest.approx(0.0123) and "checkpoint" in origin
    # a stored value for another quantile does not apply: calibrate on nominal laps instead
    with pytest.raises(ValueError, match="no fallback threshold stored"):
        resolve_threshold(stored, FallbackConfig(quantile=0.9), env_kwargs=env)
    value, origin = resolve_threshold(plain, FallbackConfig(quantile=0.9), calibrate_seeds=[3], samples=8,
                                      env_kwargs=env)  # fmt: skip
    assert value >= 0 and "calibrated on seeds [3] (30 nominal steps)" in origin
    # stored in the checkpoint, it is found again without driving; the weights are untouched
    from drive.loop.thresholds import store_threshold

    before = checkpoint.read(plain)["state_dict"]
    stored_value = store_threshold(plain, FallbackConfig(quantile=0.9), [3], samples=8, env_kwargs=env)
    assert stored_value == pytest.approx(value)
    again, origin = resolve_threshold(plain, FallbackConfig(quantile=0.9), samples=8, env_kwargs=env)
    assert again == pytest.approx(value) and "checkpoint" in origin
    after = checkpoint.read(plain)["state_dict"]
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_the_closed_loop_acts_on_a_closed_form_predictive_where_the_method_has_one():
    """DER in closed loop: the action is its mean gamma (the same whatever the sampling seed) and its epistemic
    variance is beta / (nu (alpha - 1)) > 0 — not one inverse-gamma draw with no disagreement to measure."""
    from agents.encoders import EncoderConfig
    from agents.registry import CONTROLLERS

    torch.manual_seed(0)
    model = CONTROLLERS["der"](encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3).build()
    frame = np.random.default_rng(0).integers(0, 256, (96, 96, 3), dtype=np.uint8)
    steps = []
    for seed in (0, 1):
        policy = ControllerPolicy(model, ObservationCoder("full", "frames", 4), seed=seed)
        policy.reset(7)
        steps.append(policy.predict(frame)[0])
    x = ObservationCoder("full", "frames", 4)(frame)
    with torch.no_grad():
        exact = model.predict(x)
    assert np.array_equal(steps[0].mean, steps[1].mean)
    assert np.allclose(steps[0].mean, exact.mean[0].numpy()) and (steps[0].epistemic_var > 0).all()
    assert np.allclose(steps[0].epistemic_var, exact.epistemic_var[0].numpy())


def _tiny_checkpoint(path, name: str):
    from agents.encoders import EncoderConfig
    from agents.registry import CONTROLLERS, config_to_dict
    from drive import checkpoint

    torch.manual_seed(0)
    cfg = CONTROLLERS[name](encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=2)
    checkpoint.save(path, kind="controller", name=name, config=config_to_dict(cfg), module=cfg.build())
    return path


@pytest.mark.parametrize(
    "name, options, says",
    [
        ("gmle", [], "controller gmle has no epistemic variance (its samples never disagree), so an epistemic gate "
         "could never fire: calibrate on its total variance instead (--variance total"),
        ("nsac", ["--samples", "1"], "with --samples 1 controller nsac's samples cannot disagree, so its epistemic "
         "variance is 0 and an epistemic gate could never fire: give --samples 2 or more"),
    ],
)  # fmt: skip
def test_a_gate_that_could_never_fire_is_refused_before_any_lap_and_nothing_stored(name, options, says, tmp_path,
                                                                                   capsys):  # fmt: skip
    """GMLE's samples never disagree (epistemic variance exactly 0): its calibrated threshold would be 0 and the
    gate would never fire. Refused in one line naming what works instead; so is any controller at --samples 1."""
    from drive.cli import main

    path = _tiny_checkpoint(tmp_path / f"{name}.pt", name)
    before = path.read_bytes()
    assert main(["fallback", "calibrate", "--ckpt", str(path), *options, "--seeds", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"drive fallback calibrate: error: {path}: {says}"), err
    assert path.read_bytes() == before  # nothing written


def test_a_threshold_that_separates_nothing_is_not_stored(tmp_path, monkeypatch):
    from drive.errors import UserError
    from drive.loop import thresholds

    path = _tiny_checkpoint(tmp_path / "nsac.pt", "nsac")
    before = path.read_bytes()
    env = {"name": "fake-road", "max_episode_steps": 30}
    for scores, quantile, says in ((np.full(30, 0.25), 0.99, "all 30 nominal steps scored the same"),
                                   (np.r_[np.zeros(99), 1.0], 0.9, "quantile of the epistemic variance of steer on "
                                    "100 nominal steps is 0 (99 scored 0)")):  # fmt: skip
        monkeypatch.setattr(thresholds, "nominal_scores", lambda *args, s=scores: s)
        with pytest.raises(UserError, match=re.escape(says)):
            thresholds.store_threshold(path, FallbackConfig(quantile=quantile), [3], samples=8, env_kwargs=env)
    assert path.read_bytes() == before
