"""The closed loop: results agree with what observers saw, seeds replay, DART noise keeps the label clean."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from drive.errors import UserError
from drive.loop.policies import ExpertPolicy, NoisyPolicy
from drive.loop.rollout import PolicyOutput, StepRecord, clip_action, rollout
from drive.loop.seeds import format_seeds, parse_seeds
from sim_bridges.fake_road import FakeRoadDriver, make_fake_road


class Log:
    def __init__(self):
        self.records: list[StepRecord] = []

    def __call__(self, record: StepRecord) -> None:
        self.records.append(record)


class Swerve:
    """Drives straight at full gas while steering hard one way, then the other: leaves the road, comes back."""

    def __init__(self):
        self.t = 0

    def reset(self, seed=None):
        self.t = 0

    def act(self, obs, info):
        self.t += 1
        steer = 1.0 if (self.t // 25) % 2 == 0 else -1.0
        return PolicyOutput(np.array([steer, 0.5, 0.0], np.float32), source="swerve", latency_ms=float(self.t))


def test_results_agree_with_the_steps_observers_saw():
    env = make_fake_road(max_episode_steps=150)
    log = Log()
    results = rollout(env, ExpertPolicy(FakeRoadDriver()), seeds=[3, 4], on_step=log)
    assert [r.seed for r in results] == [3, 4]
    for result in results:
        steps = [r for r in log.records if r.seed == result.seed]
        assert [r.t for r in steps] == list(range(result.steps))
        assert result.return_ == pytest.approx(sum(r.reward for r in steps))
        assert result.completion == steps[-1].next_info["progress"]
        assert result.tiles == steps[-1].next_info["tiles_visited"]
        assert steps[-1].done and not any(r.done for r in steps[:-1])
        # the observation handed to the policy at t+1 is the env's answer at t
        for a, b in zip(steps, steps[1:], strict=False):
            assert a.next_obs is b.obs
    assert all(r.episode == (0 if r.seed == 3 else 1) for r in log.records)


def test_off_track_events_count_rising_edges_and_policy_outputs_reach_observers():
    env = make_fake_road(max_episode_steps=200)
    log = Log()
    [result] = rollout(env, Swerve(), seeds=[0], on_step=log)
    off = [bool(log.records[0].info["off_track"])] + [bool(r.next_info["off_track"]) for r in log.records]
    rising = sum(b and not a for a, b in zip(off, off[1:], strict=False))
    assert rising >= 1
    assert result.off_track_events == rising
    assert result.first_off_track == next(t for t in range(len(off) - 1) if off[t + 1] and not off[t])
    assert result.to_dict()["first_off_track"] == result.first_off_track
    assert [r.output.latency_ms for r in log.records] == list(range(1, result.steps + 1))
    assert {r.source for r in log.records} == {"swerve"}


def test_same_seed_replays_exactly_and_seeds_differ():
    env = make_fake_road(max_episode_steps=80)
    policy = NoisyPolicy(ExpertPolicy(FakeRoadDriver()), 0.3, env.action_space.low, env.action_space.high)
    a, b = Log(), Log()
    rollout(env, policy, seeds=[7], on_step=a)
    rollout(env, policy, seeds=[7], on_step=b)
    assert np.array_equal(np.stack([r.action for r in a.records]), np.stack([r.action for r in b.records]))
    assert np.array_equal(np.stack([r.obs for r in a.records]), np.stack([r.obs for r in b.records]))
    c = Log()
    rollout(env, policy, seeds=[8], on_step=c)
    assert not np.array_equal(np.stack([r.action for r in a.records]), np.stack([r.action for r in c.records]))


def test_dart_noise_perturbs_the_executed_action_only():
    env = make_fake_road(max_episode_steps=300)
    low, high = env.action_space.low, env.action_space.high
    log = Log()
    rollout(env, NoisyPolicy(ExpertPolicy(FakeRoadDriver()), 0.2, low, high, noise_seed=5), seeds=[1], on_step=log)
    label = np.stack([r.label for r in log.records])  # (T, 3)
    action = np.stack([r.action for r in log.records])  # (T, 3)
    assert np.all(action >= low) and np.all(action <= high)
    # the label is what the clean expert says in the state the noisy run reached
    expert = FakeRoadDriver()
    clean = np.stack([np.clip(expert.act(r.info["state"]), low, high) for r in log.records])
    np.testing.assert_allclose(label, clean, atol=1e-6)
    # steering is rarely clipped: there the difference is the Gaussian noise itself
    noise = (action - label)[:, 0]
    inside = np.abs(action[:, 0]) < 0.999
    assert inside.mean() > 0.9
    assert np.std(noise[inside]) == pytest.approx(0.2, rel=0.15)
    assert abs(np.mean(noise[inside])) < 0.05


def test_policy_without_output_wrapper_gets_clipped_and_labelled():
    env = make_fake_road(max_episode_steps=5)

    class Wild:
        def reset(self, seed=None):
            pass

        def act(self, obs, info):
            return np.array([3.0, 2.0, -1.0])

    log = Log()
    rollout(env, Wild(), n_episodes=1, on_step=log)
    np.testing.assert_array_equal(log.records[0].action, [1.0, 1.0, 0.0])
    np.testing.assert_array_equal(log.records[0].label, log.records[0].action)


def test_episode_summary_of_the_policy_lands_in_the_result():
    env = make_fake_road(max_episode_steps=10)

    class Counting(ExpertPolicy):
        def reset(self, seed=None):
            super().reset(seed)
            self.n = 0

        def act(self, obs, info):
            self.n += 1
            return super().act(obs, info)

        def episode_summary(self):
            return {"n_calls": self.n}

    [result] = rollout(env, Counting(FakeRoadDriver()), seeds=[0])
    assert result.to_dict()["n_calls"] == result.steps == 10


def test_n_episodes_and_seeds():
    env = make_fake_road(max_episode_steps=3)
    policy = ExpertPolicy(FakeRoadDriver())
    assert [r.seed for r in rollout(env, policy, n_episodes=2)] == [0, 1]
    assert [r.seed for r in rollout(env, policy, n_episodes=2, seeds=[5, 6, 7])] == [5, 6]
    with pytest.raises(ValueError, match="only 1 seeds"):
        rollout(env, policy, n_episodes=2, seeds=[5])
    with pytest.raises(ValueError, match="seeds or n_episodes"):
        rollout(env, policy)


def test_parse_seeds():
    assert parse_seeds("1000-1003") == [1000, 1001, 1002, 1003]
    assert parse_seeds("3,1,2") == [3, 1, 2]
    assert parse_seeds("0-2, 10, 20-21") == [0, 1, 2, 10, 20, 21]
    assert parse_seeds("7") == [7]
    for bad in ("5-3", "a-b", "", "1,1", "1-", "-3", "1.5", "0-99999999999"):
        with pytest.raises(UserError, match="seed spec"):
            parse_seeds(bad)
    assert format_seeds([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"
    assert parse_seeds(format_seeds([3, 4, 9])) == [3, 4, 9]


def test_the_loops_clip_is_np_clip_on_every_awkward_value():
    """`clip_action` (np.maximum then np.minimum) gives np.clip's bits on NaN, infinities, signed zeros and ties, and
    so does NoisyPolicy, which clips with it."""
    low, high = np.array([-1.0, 0.0, 0.0], np.float32), np.array([1.0, 1.0, 1.0], np.float32)
    values = np.array([-0.0, 0.0, np.nan, np.inf, -np.inf, -1.0, 1.0, 2.0, -2.0, 0.5, 1e-45, -1e-45], np.float32)
    policy = NoisyPolicy(ExpertPolicy(FakeRoadDriver()), 0.0, low, high)
    for action in itertools.product(values, repeat=3):
        a = np.array(action, np.float32)
        assert clip_action(a, low, high).view(np.uint32).tolist() == np.clip(a, low, high).view(np.uint32).tolist()
        out = policy.wrap(a)
        assert out.label.view(np.uint32).tolist() == np.clip(a, low, high).view(np.uint32).tolist(), a
        assert out.action.view(np.uint32).tolist() == np.clip(np.clip(a, low, high) + 0.0, low, high).view(
            np.uint32).tolist(), a  # fmt: skip
