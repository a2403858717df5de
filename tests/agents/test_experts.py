"""Experts: pure pursuit and the PPO checkpoint load and act; export is faithful to SB3; bad files fail clearly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from gymnasium.envs.box2d.car_dynamics import Car

import agents.experts.ppo as ppo
from agents.experts.ppo import PPOExpert, PPOPolicy, PPOPolicyConfig, to_env_action
from drive import checkpoint
from drive.learn.ppo_expert import held_out_returns as episode_returns
from drive.learn.ppo_expert import return_stats as summarise
from drive.loop.specs import SHIPPED, load_expert
from sim_bridges.carracing.bridge import IDX, LOOKAHEAD_M, STATE_DIM, STATE_NAMES, make_carracing


def _straight_state(y_ahead: float, speed: float = 20.0) -> np.ndarray:
    """A state whose centreline bends sideways by y_ahead * (d / 30)^2 metres at look-ahead d."""
    s = np.zeros(STATE_DIM, np.float32)
    s[IDX["speed"]] = speed
    for d in LOOKAHEAD_M:
        s[IDX[f"ahead_x_{d:g}"]] = d
        s[IDX[f"ahead_y_{d:g}"]] = y_ahead * (d / 30.0) ** 2
        s[IDX[f"ahead_dir_{d:g}"]] = np.arctan2(2 * y_ahead * d / 900.0, 1.0)
    return s


def test_pursuit_steers_towards_the_path_and_slows_for_bends():
    expert = load_expert("pursuit")
    expert.reset()
    left, right, straight = (expert.act(_straight_state(y)) for y in (8.0, -8.0, 0.0))
    for a in (left, right, straight):
        assert a.shape == (3,) and a.dtype == np.float32
        assert -1 <= a[0] <= 1 and 0 <= a[1] <= 1 and 0 <= a[2] <= 1
    assert left[0] < -0.05 and right[0] > 0.05 and straight[0] == pytest.approx(0.0, abs=1e-6)
    assert left[0] == pytest.approx(-right[0])
    bend = _straight_state(30.0)
    v_bend, v_straight = expert.target_speed(bend), expert.target_speed(straight_state := _straight_state(0.0))
    assert v_bend < v_straight
    bend[IDX["speed"]] = v_bend + 15.0
    assert expert.act(bend)[2] > 0 and expert.act(bend)[1] == 0  # too fast for the bend: brake, no gas
    straight_state[IDX["speed"]] = v_straight - 15.0
    assert expert.act(straight_state)[1] > 0 and expert.act(straight_state)[2] == 0
    with pytest.raises(ValueError, match="shape"):
        expert.act(np.zeros(5, np.float32))


def _pursuit_alone(expert, state: np.ndarray) -> np.ndarray:
    """Pure pursuit on one state, written out scalar by scalar with np.interp (the expert before it took lanes)."""
    c, s = expert.cfg, np.asarray(state, np.float64)
    speed = s[expert.i_speed]
    l_d = np.clip(c.k_speed * speed + c.l_0, c.l_min, c.l_max)
    x, y = np.interp(l_d, expert.d, s[expert.ix]), np.interp(l_d, expert.d, s[expert.iy])
    steer = float(np.clip(-np.arctan(c.wheelbase * 2.0 * y / max(x * x + y * y, 1e-6)) / c.max_wheel_angle, -1, 1))
    kappa = np.maximum(np.abs(np.diff(s[expert.idir])) / np.diff(expert.d), 1e-4)
    v_target = min(c.v_max, np.sqrt(np.sqrt(c.a_lat / kappa) ** 2 + 2.0 * c.a_brake * expert.d[:-1]).min())
    err = v_target - speed
    gas = float(np.clip(c.k_gas * err, 0.0, 1.0)) * (1.0 - 0.7 * abs(steer))
    return np.array([steer, gas, float(np.clip(-c.k_brake * err, 0.0, c.brake_max))], np.float32)


def test_pursuit_on_many_states_at_once_is_each_state_alone_bit_for_bit():
    """`act_many` (K lanes' shadow experts in one call) against the scalar maths, random states and the edges of
    np.interp: look-ahead before the first sample, on a sample, past the last, nan and inf entries."""
    base = load_expert("pursuit")
    rng = np.random.default_rng(0)
    states = np.concatenate([rng.normal(size=(400, STATE_DIM)) * scale for scale in (0.1, 3.0, 60.0)])
    states[::3, IDX["speed"]] = rng.choice([0.0, 5.0, 4 / 0.35, 20.0, 24 / 0.35, 400.0, np.nan, np.inf], size=400)
    states[::7, IDX["ahead_x_15"]] = np.nan
    states[::5, IDX["ahead_x_10"]] = np.inf  # with the next sample inf too (rows 0, 10, ..): np.interp's retries
    states[::2, IDX["ahead_x_15"]] = np.where(
        np.arange(len(states))[::2] % 5 == 0, np.inf, states[::2, IDX["ahead_x_15"]]
    )
    states[::13, IDX["ahead_dir_20"]] = np.nan
    for expert in (base, type(base)(dataclasses.replace(base.cfg, l_min=0.5, l_0=0.0, l_max=200.0))):
        for batch in (states, states.astype(np.float32)):  # the env's states are float32
            with np.errstate(all="ignore"):
                alone = np.array([_pursuit_alone(expert, s) for s in batch])
                together = expert.act_many(batch)
            assert np.isnan(alone).any() and np.isfinite(alone).sum() > 0.9 * alone.size
            assert np.array_equal(together, alone, equal_nan=True)


def test_pursuit_drives_the_start_of_a_track():
    results = episode_returns(load_expert("pursuit"), [3], max_episode_steps=300)
    assert results[0]["progress"] > 0.2  # ~a quarter lap in 300 steps (6 s), not wandering on the grass


def test_accel_mode_maps_one_pedal_axis_to_gas_or_brake():
    cfg = PPOPolicyConfig(obs_dim=STATE_DIM, hidden=(8,), action_mode="accel", brake_scale=0.8)
    a = torch.tensor([[0.3, 0.5], [-1.0, -0.5], [2.0, -3.0]])
    got = to_env_action(a, torch.zeros(3), cfg)
    np.testing.assert_allclose(got.numpy(), [[0.3, 0.5, 0.0], [-1.0, 0.0, 0.4], [1.0, 0.0, 0.8]], atol=1e-6)


def test_speed_mode_servo_never_parks_the_car():
    cfg = PPOPolicyConfig(obs_dim=STATE_DIM, hidden=(8,), action_mode="speed", v_min=5.0, v_max=105.0)
    pedal = torch.linspace(-1, 1, 9)
    at_rest = to_env_action(torch.stack([torch.zeros(9), pedal], 1), torch.zeros(9), cfg)  # (9, 3)
    assert torch.all(at_rest[:, 1] > 0) and torch.all(at_rest[:, 2] == 0)  # even "slowest" means drive on
    fast = to_env_action(torch.tensor([[0.0, -1.0], [0.0, 0.0]]), torch.tensor([60.0, 60.0]), cfg)
    np.testing.assert_allclose(fast[0].numpy(), [0.0, 0.0, 0.8], atol=1e-6)  # target 5 m/s: brake, capped
    np.testing.assert_allclose(fast[1].numpy(), [0.0, 0.0, 0.06 * (60 - 55)], atol=1e-6)  # target 55 m/s
    policy = PPOPolicy(cfg)
    x = torch.randn(16, STATE_DIM)
    np.testing.assert_allclose(policy(x).detach(), to_env_action(policy.policy_action(x), x[:, 0], cfg).detach())


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("mode", ["accel", "speed"])
def test_the_expert_acts_as_its_torch_policy_computes(activation, mode):
    """PPOExpert's numpy/numba forward is PPOPolicy.forward up to the order of the sums; the action
    parametrisation gives the same bits on numpy arrays as on tensors."""
    cfg = PPOPolicyConfig(obs_dim=STATE_DIM, hidden=(32, 24), activation=activation, action_mode=mode)
    torch.manual_seed(0)
    policy = PPOPolicy(cfg)
    with torch.no_grad():
        policy.obs_mean.normal_()
        policy.obs_var.uniform_(0.5, 4.0)
    states = torch.randn(7, STATE_DIM) * 3
    states[:, cfg.speed_index] = torch.linspace(0.0, 80.0, 7)
    want = policy(states).detach().numpy()
    got = PPOExpert(policy).act_many(states.numpy())
    assert got.dtype == np.float32 and got.shape == (7, 3)
    np.testing.assert_allclose(got, want, atol=1e-5)
    a = torch.randn(64, 2) * 1.5
    speed = torch.rand(64) * 100
    assert np.array_equal(to_env_action(a.numpy(), speed.numpy(), cfg), to_env_action(a, speed, cfg).numpy())


def test_the_kernels_clip_is_numpys_clip_on_every_awkward_value():
    """Whichever numpy runs: its clip's tie with the lower bound (-0.0 at 0.0) differs between numpy 1.26 and 2."""
    values = np.array([-0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf, -1.0, 1.0, 10.0, -10.5, 0.8, 1e-45], np.float32)
    for lo, hi in ((-1.0, 1.0), (0.0, 1.0), (0.0, 0.8), (-10.0, 10.0)):
        want = np.clip(values, lo, hi)
        got = np.array([ppo._clip(v, np.float32(lo), np.float32(hi), ppo.TIE_KEEPS_X) for v in values], np.float32)
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist(), (lo, hi)


@pytest.mark.parametrize("mode", ["accel", "speed"])
def test_the_expert_kernels_keep_numpys_bits(mode):
    """The standardisation and action kernels against numpy's ops on the same layer outputs, bit for bit: states
    with NaN, infinities, signed zeros, values at and past the clip bound; policy outputs of -0.0, ties at +-1, NaN."""
    cfg = PPOPolicyConfig(obs_dim=STATE_DIM, hidden=(16,), action_mode=mode, v_min=5.0, v_max=110.0)
    torch.manual_seed(0)
    policy = PPOPolicy(cfg)
    with torch.no_grad():
        policy.obs_mean.normal_()
        policy.obs_var.uniform_(0.5, 4.0)
    expert = PPOExpert(policy)
    rng = np.random.default_rng(0)
    states = (rng.normal(size=(300, STATE_DIM)) * rng.choice([0.1, 3.0, 40.0], size=(300, 1))).astype(np.float32)
    edges = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, 110.0, 5.0], np.float32)
    states[::3, 1:9] = edges
    states[::4, 1] = expert._mean[1] + 10 * expert._std[1]  # at the clip bound
    states[:, cfg.speed_index] = rng.choice([0.0, -0.0, 5.0, 57.5, 110.0, 300.0, np.nan, np.inf], size=300)
    # layer outputs pinned to the awkward values
    outputs = rng.choice(np.array([-0.0, 0.0, 1.0, -1.0, 1.5, -7.0, np.nan, np.inf, 0.25, -0.3], np.float32),
                         size=(300, 2))  # fmt: skip
    bound, keep, mode_is_speed = np.float32(cfg.clip_obs), ppo.TIE_KEEPS_X, mode == "speed"
    speed = np.ascontiguousarray(states[:, cfg.speed_index])
    with np.errstate(all="ignore"):
        z = ppo._standardised(states, expert._mean, expert._std, bound, keep, np.empty_like(states))
        got = ppo._env_actions(outputs, speed, mode_is_speed, keep, expert._consts, np.empty((300, 3), np.float32))
        want_z = ((states - expert._mean) / expert._std).clip(-cfg.clip_obs, cfg.clip_obs)
        want = to_env_action(outputs.clip(-1.0, 1.0), states[:, cfg.speed_index], cfg).astype(np.float32)
        # act_many's fused layers are these kernels and `_dense`, one after the other, bit for bit
        (w1, b1), (w2, b2) = expert._layers
        hidden = np.tanh(ppo._dense(z, w1, b1, np.empty((300, w1.shape[1]), np.float32)))
        last = ppo._dense(hidden, w2, b2, np.empty((300, 2), np.float32))
        composed = ppo._env_actions(last, speed, mode_is_speed, keep, expert._consts, np.empty((300, 3), np.float32))
        fused = expert.act_many(states)
    assert z.view(np.uint32).tolist() == want_z.view(np.uint32).tolist()  # standardised, bit for bit
    assert got.dtype == np.float32 and got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert np.isnan(got).any() and np.signbit(got[got == 0]).any()  # the awkward values did reach the output
    assert fused.view(np.uint32).tolist() == composed.view(np.uint32).tolist()


def test_export_reproduces_sb3_deterministic_actions(tmp_path):
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from drive.commands.expert.train import Config
    from drive.learn.ppo_envs import PolicyAction
    from drive.learn.ppo_expert import export_policy, policy_config, save_expert

    cfg = Config(hidden=(16, 16))
    venv = VecNormalize(DummyVecEnv([lambda: PolicyAction(make_carracing(mode="state"), policy_config(cfg))]))
    model = PPO(
        "MlpPolicy", venv, n_steps=64, batch_size=32, n_epochs=1, use_sde=True, device="cpu", seed=0,
        policy_kwargs=dict(net_arch=dict(pi=[16, 16], vf=[16, 16]), activation_fn=torch.nn.Tanh),
    )  # fmt: skip
    model.learn(64)  # one update, and non-trivial running observation statistics
    obs = np.stack([venv.get_original_obs()[0] + k for k in range(5)])  # (5, STATE_DIM) raw states
    sb3_action, _ = model.predict(venv.normalize_obs(obs), deterministic=True)  # (5, 2)
    policy, pcfg = export_policy(model, venv, cfg)
    ours = policy.policy_action(torch.as_tensor(obs, dtype=torch.float32)).detach().numpy()
    np.testing.assert_allclose(ours, sb3_action, atol=1e-5)
    path = save_expert(tmp_path / "e.pt", policy, pcfg, {"heldout_mean": 1.0}, {"steps": 64})
    reloaded = load_expert(path)
    want = to_env_action(torch.as_tensor(sb3_action[:1]), torch.as_tensor(obs[:1, IDX["speed"]]), pcfg)[0]
    np.testing.assert_allclose(reloaded.act(obs[0]), want.numpy(), atol=1e-5)


def test_shipped_ppo_checkpoint_loads_and_acts():
    payload = checkpoint.read(SHIPPED["ppo"], kind="expert")
    assert payload["name"] == "ppo" and tuple(payload["config"]["state_names"]) == STATE_NAMES
    assert payload["metrics"]["heldout_mean"] > 0
    expert = load_expert("ppo")
    env = make_carracing(mode="state")
    _, info = env.reset(seed=4)
    expert.reset()
    for _ in range(20):
        a = expert.act(info["state"])
        assert a.shape == (3,) and a.dtype == np.float32 and np.all(np.isfinite(a))
        _, _, _, _, info = env.step(a)
    assert info["speed"] > 1.0  # it drives off the line


def test_bad_expert_checkpoints_give_clear_errors(tmp_path):
    policy = PPOPolicy(PPOPolicyConfig(obs_dim=STATE_DIM, hidden=(4,)))
    cfg = {**policy.cfg.to_dict(), "state_names": list(STATE_NAMES)}
    wrong_kind = checkpoint.save(tmp_path / "c.pt", kind="controller", name="ppo", config=cfg, module=policy)
    with pytest.raises(checkpoint.CheckpointError, match="is a trained controller .drive train., but an expert"):
        load_expert(wrong_kind)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"\x00not a zip" * 10)
    with pytest.raises(checkpoint.CheckpointError, match="corrupt.pt: not a readable"):
        load_expert(corrupt)
    old_layout = {**cfg, "state_names": list(STATE_NAMES[:-3])}
    stale = checkpoint.save(tmp_path / "s.pt", kind="expert", name="ppo", config=old_layout, module=policy)
    with pytest.raises(checkpoint.CheckpointError, match="state layout"):
        load_expert(stale)
    bad_weights = checkpoint.save(
        tmp_path / "w.pt", kind="expert", name="ppo", config={**cfg, "hidden": [5]}, module=policy
    )
    with pytest.raises(checkpoint.CheckpointError, match="w.pt: config/weights do not match"):
        load_expert(bad_weights)
    with pytest.raises(ValueError, match="not an expert name"):
        load_expert("no_such_expert")


def test_ppo_expert_rejects_a_wrong_state_shape():
    expert = PPOExpert(PPOPolicy(PPOPolicyConfig(obs_dim=STATE_DIM, hidden=(4,))))
    with pytest.raises(ValueError, match="shape"):
        expert.act(np.zeros(STATE_DIM + 1, np.float32))


@pytest.mark.slow
@pytest.mark.parametrize("seeds", [range(1000, 1020), range(2000, 2030)])
def test_ppo_expert_closed_loop_scores(seeds):
    s = summarise(episode_returns(load_expert("ppo"), seeds, mode="state"))
    assert s["mean"] >= 880 and s["min"] >= 700, s


@pytest.mark.slow
def test_pursuit_closed_loop_scores():
    s = summarise(episode_returns(load_expert("pursuit"), range(2000, 2030), mode="state"))
    assert s["mean"] >= 850, s


def test_expert_train_writes_curve_keeps_best_and_resumes(tmp_path, monkeypatch):
    import json
    import tempfile

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))

    from drive.commands.expert.train import Config, run

    common = dict(run_dir=tmp_path / "run", out=tmp_path / "best.pt", n_envs=1, n_steps=256, batch_size=128,
                  n_epochs=1, eval_every=512, eval_seeds="5000", hidden=(16,))  # fmt: skip
    assert run(Config(total_steps=512, **common)) == 0
    run_dir = tmp_path / "run"
    assert {"config.json", "eval.csv", "eval.json", "eval.png", "sb3_last.zip", "expert_best.pt"} <= {
        p.name for p in run_dir.iterdir()
    }
    assert run(Config(total_steps=1024, resume=True, **common)) == 0
    history = json.loads((run_dir / "eval.json").read_text())
    assert [h["steps"] for h in history] == [512, 1024]  # resumed where it stopped, not from zero
    assert not list((tmp_path / "tmp").glob("SB3-*"))  # SB3's default logger left an empty SB3-* folder per run
    best = checkpoint.read(tmp_path / "best.pt", kind="expert")
    assert best["metrics"]["heldout_mean"] == pytest.approx(max(h["mean"] for h in history))
    with pytest.raises(ValueError, match="1000-1019"):
        run(Config(**{**common, "total_steps": 512, "eval_seeds": "1010-1012"}))


def test_training_shaping_charges_wheels_off_road_and_ends_long_excursions():
    from drive.learn.ppo_envs import TrainShaping

    plain = make_carracing(mode="state")
    shaped = TrainShaping(make_carracing(mode="state"), patience=3, penalty=20.0, wheel_penalty=0.05)
    for env in (plain, shaped):
        env.reset(seed=2)
        base = env.unwrapped
        _, beta, x, y = base.track[30]
        base.car.destroy()
        base.car = Car(base.world, beta + 1.2, x + 30 * np.cos(beta), y + 30 * np.sin(beta))  # on the grass
    zero = np.zeros(3, np.float32)
    for k in range(3):
        _, r_plain, term_plain, _, _ = plain.step(zero)
        _, r_shaped, term_shaped, _, info = shaped.step(zero)
        assert info["off_track"] and not term_plain
        if k < 2:
            assert r_shaped == pytest.approx(r_plain - 4 * 0.05) and not term_shaped
    assert term_shaped and r_shaped == pytest.approx(r_plain - 4 * 0.05 - 20.0)  # third off-track step in a row


def test_training_start_perturbation_covers_any_heading_on_the_road():
    from drive.learn.ppo_envs import TrainShaping
    from sim_bridges.carracing.bridge import TRACK_HALF_WIDTH

    env = TrainShaping(make_carracing(mode="state"), patience=60, penalty=20.0, perturb_prob=1.0)
    headings = []
    for seed in range(8):
        obs, info = env.reset(seed=seed)
        np.testing.assert_array_equal(obs, info["state"])
        assert abs(obs[IDX["lateral_offset"]]) <= 0.8 * TRACK_HALF_WIDTH + 0.2 and not info["off_track"]
        headings.append(obs[IDX["heading_error"]])
    assert max(np.abs(headings)) > np.pi / 2  # some starts face backwards: the policy must learn to turn round
    plain = TrainShaping(make_carracing(mode="state"), patience=60, penalty=20.0, perturb_prob=0.0)
    obs, _ = plain.reset(seed=0)
    assert abs(obs[IDX["heading_error"]]) < 0.05 and abs(obs[IDX["lateral_offset"]]) < 0.05
