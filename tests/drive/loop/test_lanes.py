"""Lanes: K cars in one process give each episode the record it gets alone (agents/lane_noise.py, rollout
`run_lanes`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from agents.encoders import EncoderConfig
from agents.lane_noise import MIN_ROWS, LaneGenerators, lane_noise
from agents.registry import CONTROLLERS
from datasets.frames import ObservationCoder
from drive.loop.envs import make_env
from drive.loop.evaluate import evaluate
from drive.loop.lanes import act_lanes, expert_lanes, lane_copies, predict_lanes
from drive.loop.options import EvalOptions
from drive.loop.policies import ControllerPolicy, ExpertPolicy
from drive.loop.rollout import Lane, rollout, run_lanes
from drive.loop.specs import expert_policy, load_expert

CLOSED_LOOP = ("nsac", "gmle", "mcd", "de", "der", "sdenet")
NSAC = Path(__file__).resolve().parents[3] / "checkpoints" / "carracing_nsac.pt"


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_each_lane_draws_what_its_generator_draws_alone(axis):
    shape = [3, 4, 5]
    shape[axis] = 3
    lanes = LaneGenerators([torch.Generator().manual_seed(s) for s in (7, 8, 9)])
    for kind in ("normal", "uniform"):
        for g, s in zip(lanes.generators, (7, 8, 9), strict=True):
            g.manual_seed(s)
        got = lane_noise(shape, lanes, axis, kind)
        for b, s in enumerate((7, 8, 9)):
            one = list(shape)
            one[axis] = 1
            alone = lane_noise(one, torch.Generator().manual_seed(s), axis, kind)
            assert torch.equal(got.narrow(axis, b, 1), alone), (kind, b)
    with pytest.raises(ValueError, match="lane axis"):
        lane_noise([2, 2], lanes, 0)


@pytest.mark.parametrize(("shape", "axis"), [([3, 5], 0), ([3, 37], 0), ([3, 4, 32, 4, 4], 0), ([1, 3, 37], 1)])
def test_lanes_drawn_in_place_equal_their_draws_alone(shape, axis):
    """Where each lane's slice is one contiguous block it is drawn in place: under 16 values, 16 and over with a
    ragged tail (CPU draws 16 at a time), NSAC's (B, H, S, K, n) shape, a lane axis after a size-1 axis."""
    seeds = (3, 4, 5)
    for kind in ("normal", "uniform"):
        got = lane_noise(shape, LaneGenerators([torch.Generator().manual_seed(s) for s in seeds]), axis, kind)
        for b, s in enumerate(seeds):
            one = list(shape)
            one[axis] = 1
            alone, g = torch.empty(one), torch.Generator().manual_seed(s)
            alone = alone.normal_(generator=g) if kind == "normal" else alone.uniform_(generator=g)
            assert torch.equal(got.narrow(axis, b, 1), alone), (kind, b)


def _controller(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    encoder = EncoderConfig(kind="frames", n_tokens=4, d_model=16)
    cfg = CONTROLLERS[name](encoder=encoder, out_dim=3, n_heads=2)
    return cfg.build().eval()


@pytest.mark.parametrize("name", CLOSED_LOOP)
def test_a_lane_predicts_the_same_in_any_batch(name):
    """Nine lanes in one call vs each alone (padded to MIN_ROWS): bit-equal predictions and internals, two steps."""
    model = _controller(name)
    assert model.lane_sampling, f"{name} drives in closed loop: its sampling must be lane-aware"
    lanes = lane_copies(ControllerPolicy(model, ObservationCoder(), samples=8, seed=3), 9)
    solo = lane_copies(ControllerPolicy(model, ObservationCoder(), samples=8, seed=3), 9)
    rng = np.random.default_rng(0)
    for policy_set in (lanes, solo):
        for seed, p in enumerate(policy_set):
            p.reset(seed=seed)
    for _ in range(2):
        frames = [rng.integers(0, 256, (96, 96, 3), dtype=np.uint8) for _ in lanes]
        together = predict_lanes(lanes, frames)
        alone = [predict_lanes([p], [f])[0] for p, f in zip(solo, frames, strict=True)]
        for b, ((p1, i1, _), (p2, i2, _)) in enumerate(zip(together, alone, strict=True)):
            for field in ("mean", "aleatoric_var", "epistemic_var"):
                assert np.array_equal(getattr(p1, field), getattr(p2, field)), (name, b, field)
            if i1 is not None:
                assert i2 is not None and i1.values.keys() == i2.values.keys()
                for key in i1.values:
                    assert np.array_equal(i1.values[key], i2.values[key]), (name, b, key)
    assert MIN_ROWS >= 2


def test_lane_copies_share_the_model_and_nothing_else():
    policy = ControllerPolicy(_controller("nsac"), ObservationCoder(), shadow=expert_policy("pursuit").expert)
    a, b = lane_copies(policy, 2)
    assert a is policy and b.model is a.model
    assert b.coder is not a.coder and b.stats is not a.stats and b.generator is not a.generator
    assert b.shadow is not a.shadow


def test_run_lanes_matches_one_episode_at_a_time_in_seed_order():
    """Three lanes over seven seeds of uneven length: the same results as `rollout`, in seed order, with each
    lane's observers seeing only its own episodes, every step of each in order."""
    seeds = [5, 1, 4, 2, 6, 3, 0]

    def lane() -> Lane:
        env = make_env("fake-road", pixels=False, max_episode_steps=40 + 0)
        return Lane(env, ExpertPolicy(expert_policy("pursuit", "fake-road").expert), [])

    lanes = [lane() for _ in range(3)]
    seen: list[list[tuple[int, int]]] = [[] for _ in lanes]
    for j, one in enumerate(lanes):
        one.observers = [lambda r, j=j: seen[j].append((r.seed, r.t))]
    ended: list[int] = []
    got = run_lanes(lanes, seeds, act_lanes, lambda j, result: ended.append(result.seed))
    ref = rollout(make_env("fake-road", pixels=False, max_episode_steps=40), lanes[0].policy, seeds=seeds)
    assert [r.to_dict() for r in got] == [r.to_dict() for r in ref]
    assert sorted(ended) == sorted(seeds)
    for steps in seen:
        for (s0, t0), (s1, t1) in zip(steps, steps[1:], strict=False):
            assert (s1 == s0 and t1 == t0 + 1) or (s1 != s0 and t1 == 0)


@pytest.mark.skipif(not NSAC.exists(), reason="the shipped checkpoint is absent")
def test_drive_eval_records_equal_for_one_and_sixteen_cars():
    """The issue's acceptance: `drive eval` of the shipped NSAC (S = 32, shadow expert) on 16 seeds, K = 1 vs 16."""
    records = {}
    for k in (1, 16):
        opts = EvalOptions(policy=f"ckpt:{NSAC}", seeds="1000-1015", max_episode_steps=60, progress=False, envs=k,
                           failure_horizon=0)  # fmt: skip
        out = evaluate(opts)
        records[k] = [{key: v for key, v in r.items() if key not in ("wall_s", "latency_ms_p50", "latency_ms_p95")}
                      for r in out["episodes"]]  # fmt: skip
    assert records[1] == records[16]


def test_the_ppo_expert_answers_each_lane_what_it_answers_alone():
    """One forward for K lanes (padded like the controller's, agents/experts/ppo.py): each row bit for bit its
    single answer, for every K, beside an expert that acts alone (pursuit), in lane order."""
    ppo, pursuit = load_expert("ppo"), load_expert("pursuit")
    states = np.random.default_rng(0).normal(size=(9, ppo.policy.cfg.obs_dim)).astype(np.float32) * 3
    alone = [ppo.act(s) for s in states]
    for k in range(1, 10):
        copies = lane_copies(ExpertPolicy(ppo), k)
        got = expert_lanes([c.expert for c in copies], list(states[:k]))
        assert all(np.array_equal(a, b) for a, b in zip(got, alone[:k], strict=True)), k
    mixed = expert_lanes([ppo, pursuit, ppo], [states[0], states[1], states[2]])
    assert np.array_equal(mixed[0], alone[0]) and np.array_equal(mixed[2], alone[2])
    assert np.array_equal(mixed[1], pursuit.act(states[1]))


def test_pure_pursuit_lanes_answer_in_one_call_what_each_answers_alone(monkeypatch):
    """Copies of one pursuit expert (the lanes' shadow experts) share a key and answer in one `act_many` call,
    each row bit for bit its single answer; an expert of another config is its own group, in lane order."""
    pursuit = load_expert("pursuit")
    other = type(pursuit)(dataclasses.replace(pursuit.cfg, wheelbase=2.0))
    states = np.random.default_rng(1).normal(size=(7, pursuit.n_state)) * 20
    calls, act_many = [], type(pursuit).act_many

    def counted(self, s):
        calls.append(len(s))
        return act_many(self, s)

    monkeypatch.setattr(type(pursuit), "act_many", counted)
    experts = [c.expert for c in lane_copies(ExpertPolicy(pursuit), 5)] + [other, pursuit]
    got = expert_lanes(experts, list(states))
    assert sorted(calls) == [1, 6]
    expected = [e.act(s) for e, s in zip(experts, states, strict=True)]
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    assert not np.array_equal(got[5], pursuit.act(states[5]))  # the other config steers its own way


@pytest.mark.skipif(not NSAC.exists(), reason="the shipped checkpoint is absent")
def test_drive_eval_with_the_ppo_shadow_records_equal_for_one_and_five_cars():
    """The shadow experts of the lanes answer in one call: the on-policy figures against them do not depend on K."""
    records = {}
    for k in (1, 5):
        opts = EvalOptions(policy=f"ckpt:{NSAC}", seeds="1000-1004", max_episode_steps=40, progress=False, envs=k,
                           failure_horizon=0, shadow="ppo")  # fmt: skip
        records[k] = [{key: v for key, v in r.items() if key not in ("wall_s", "latency_ms_p50", "latency_ms_p95")}
                      for r in evaluate(opts)["episodes"]]  # fmt: skip
    assert "coverage90_steer" in records[1][0] and records[1] == records[5]
