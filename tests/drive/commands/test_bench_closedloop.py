"""`drive bench closedloop` run tiny: every row and ratio in the JSON, EnvPool absent -> its row skipped with the
note, and the EnvPool subprocess protocol on a stand-in module. Speeds are a benchmark's, never asserted here."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from drive.cli import main
from drive.commands.bench import closedloop
from drive.studies.closedloop import envs as closedloop_envs

ROWS = ("stock", "renderer", "envpool", "stock_driving", "renderer_driving", "envpool_driving", "state_driving",
        "collect1", "collect1_k4", "collect2", "eval_k1", "eval_k2", "eval2")  # fmt: skip


def _stand_in(tmp_path, source: str) -> str:
    """A directory whose `envpool` module is `source`, for the subprocess's PYTHONPATH."""
    folder = tmp_path / "stand_in"
    folder.mkdir()
    (folder / "envpool.py").write_text(source)
    return str(folder)


def test_tiny_run_has_every_row_and_ratio_and_skips_a_missing_envpool(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", _stand_in(tmp_path, "raise ImportError('stand-in: no envpool here')\n"))
    from drive.loop import evaluate as evaluate_mod

    horizons, real = [], evaluate_mod.evaluate
    monkeypatch.setattr(evaluate_mod, "evaluate", lambda o: horizons.append(o.failure_horizon) or real(o))
    out = tmp_path / "closedloop.json"
    code = main(["bench", "closedloop", "--steps", "8", "--rounds", "2", "--episodes", "2", "--max-episode-steps",
                 "6", "--samples", "2", "--envs", "1", "2", "--eval-episodes", "2", "--eval-max-episode-steps", "3",
                 "--envpool-python", sys.executable, "--controller-calls", "2", "--out", str(out)])  # fmt: skip
    assert code == 0
    results = json.loads(out.read_text())
    assert tuple(results["rows"]) == ROWS
    assert "stand-in: no envpool here" in results["rows"]["envpool"]["skipped"]
    assert "stand-in: no envpool here" in results["rows"]["envpool_driving"]["skipped"]
    measured = {k: r for k, r in results["rows"].items() if not k.startswith("envpool")}
    assert all(not r["skipped"] and r["steps"] > 0 and r["cpu_s"] > 0 for r in measured.values())
    assert results["rows"]["stock"]["steps"] == results["rows"]["renderer"]["steps"] == 16  # 2 rounds of 8
    driving = results["rows"]["renderer_driving"]["steps"]  # the expert's 8 steps (fewer if it leaves the field)
    assert results["rows"]["stock_driving"]["steps"] == results["rows"]["state_driving"]["steps"] == driving
    assert 0 < driving <= 16
    assert results["rows"]["collect2"]["steps"] == 12  # 2 episodes of 6; the 1-worker rows in 2 rounds of them:
    assert results["rows"]["collect1"]["steps"] == results["rows"]["collect1_k4"]["steps"] == 24
    assert len(results["rows"]["collect1"]["detail"]["per_round_steps_per_cpu_s"]) == 2
    assert results["rows"]["collect1_k4"]["detail"]["envs"] == 4 and results["ratios"]["collect1_k4_over_collect1"]
    assert results["rows"]["eval_k1"]["steps"] == 6 and results["rows"]["eval2"]["steps"] == 12
    # our env measured again beside each 1-worker loop row: once per collect round, before and after each eval run
    for key, n in (("collect1", 2), ("collect1_k4", 2), ("eval_k1", 2), ("eval_k2", 2)):
        near = results["rows"][key]["detail"]["beside"]
        assert set(near) == {"renderer", "renderer_driving"} and all(len(m) == n for m in near.values()), key
        assert near["renderer"][0][0] == 8 and all(c > 0 for m in near.values() for _, c in m), key
    assert "beside" not in results["rows"]["eval2"]["detail"]  # a wall-clock ratio against eval's best K
    assert 0 < results["eval_network_ceiling"] < 1 and results["ratios"]["renderer_driving_over_renderer"] > 0
    assert results["best_envs"] in (1, 2) and results["rows"]["eval2"]["detail"]["envs"] == results["best_envs"]
    assert set(results["ratios"]) >= set(closedloop.TARGETS) and set(results["met"]) == set(closedloop.TARGETS)
    assert set(results["verdicts"]) == set(closedloop.TARGETS)
    assert all(results["verdicts"][k] == "" for k in ("renderer_over_envpool", "renderer_over_envpool_driving"))
    assert set(results["ratio_round_ranges"]) <= set(results["ratios"])  # each a [min, max] or None
    no_envpool = ("renderer_over_envpool", "renderer_over_envpool_driving", "state_over_envpool_driving")
    assert all(results["ratios"][k] is None and results["met"].get(k) is None for k in no_envpool)
    assert all(v is not None for k, v in results["ratios"].items() if k not in no_envpool)
    # warm-up, eval rows and the stage-timed eval drive their episodes only: no uncounted calibration laps
    assert horizons == [0, 0, 0, 0, 0]
    assert results["start_up"]["envs_cpu_s"] > 0 and results["start_up"]["loops_cpu_s"] > 0
    calls = results["controller_call_cpu_ms"]
    assert set(calls) == {"back_to_back", "after_state_steps", "after_pixel_steps"} and min(calls.values()) > 0
    assert not any(str(v).startswith("/") for v in results["config"].values())  # no path of this machine
    stages = results["loop_stages"]  # one more collect (2 episodes of 6) and eval (best K) run, timed by stage
    assert stages["collect"]["steps"] == 12 and stages["eval"]["steps"] == 6
    for loop, got in stages.items():
        by_label = {row["label"]: row["us_per_step"] for row in got["stages"]}
        assert by_label["env step (wrappers included)"] > 0 and got["env_us"] > 0, loop
        assert got["over_env_us"] == pytest.approx(got["us_per_step"] - got["env_us"])
        top = [row["us_per_step"] for row in got["stages"] if row["depth"] == 0]
        assert sum(top) == pytest.approx(got["us_per_step"]) and got["garbage_collector_us"] >= 0
        assert got["page_faults_per_step"] >= 0
    collect = {row["label"]: row["us_per_step"] for row in stages["collect"]["stages"]}
    assert collect["PPO expert (numba kernels)"] > 0 and collect["frame coding to 84x84 gray"] > 0
    assert collect["shard: deflate and write, per episode"] > 0
    evaluate = {row["label"]: row["us_per_step"] for row in stages["eval"]["stages"]}
    network, encoder = evaluate["network, S samples"], evaluate["encoder: the new frames' tokens"]
    assert 0 < encoder < network < evaluate["controller call"]


@pytest.mark.parametrize("envs", [["1", "3"], ["1"]])  # one car's controller call goes through its own `act`
def test_stages_only_times_collect_and_eval_at_the_largest_k_without_rows(tmp_path, envs):
    out = tmp_path / "stages.json"
    code = main(["bench", "closedloop", "--stages-only", "--episodes", "2", "--max-episode-steps", "5", "--samples",
                 "2", "--envs", *envs, "--eval-episodes", "3", "--eval-max-episode-steps", "4",
                 "--out", str(out)])  # fmt: skip
    assert code == 0
    results = json.loads(out.read_text())
    assert "rows" not in results and results["envs"] == int(envs[-1])
    assert results["loop_stages"]["collect"]["steps"] == 10 and results["loop_stages"]["eval"]["steps"] == 12
    evaluate = {row["label"]: row["us_per_step"] for row in results["loop_stages"]["eval"]["stages"]}
    network, encoder = evaluate["network, S samples"], evaluate["encoder: the new frames' tokens"]
    assert 0 < encoder < network < evaluate["controller call"] < evaluate["the K cars' step (one controller call)"]
    assert not any(str(v).startswith("/") for v in results["config"].values())


STAND_IN = """
import numpy as np
class _Env:
    def reset(self):
        return np.zeros((1, 96, 96, 3), np.uint8), {}
    def step(self, action):
        assert action.shape == (1, 3) and action.dtype == np.float32
        return np.zeros((1, 96, 96, 3), np.uint8), np.zeros(1), np.zeros(1, bool), np.zeros(1, bool), {}
def make(task_id, **kwargs):
    assert task_id == "CarRacing-v2" and kwargs["num_envs"] == 1 and kwargs["max_episode_steps"] == 7
    return _Env()
"""


def test_envpool_row_runs_in_the_given_python_and_reports_its_own_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", _stand_in(tmp_path, STAND_IN))
    cfg = closedloop.Config(max_episode_steps=7, envpool_python=sys.executable)
    steps, wall, cpu = closedloop_envs.envpool_loop(closedloop_envs.random_actions(5, 0), cfg)  # type: ignore[misc]
    assert steps == 5 and wall > 0 and cpu >= 0
    nowhere = closedloop.Config(envpool_python="/nonexistent")
    missing = closedloop_envs.envpool_loop(np.zeros((1, 3), np.float32), nowhere)
    assert isinstance(missing, str) and "/nonexistent" in missing


def test_the_experts_laps_replay_the_same_in_stock_gymnasium_and_our_env():
    import gymnasium as gym

    from sim_bridges.carracing.bridge import make_carracing

    episodes = closedloop_envs.expert_episodes("ppo", 90, 5000, 60)  # a full episode of 60 steps, then 30
    assert [(seed, len(actions)) for seed, actions in episodes] == [(5000, 60), (5001, 30)]
    poses = []
    for env in (gym.make("CarRacing-v3", max_episode_steps=60), make_carracing(max_episode_steps=60),
                make_carracing("state", max_episode_steps=60)):  # fmt: skip
        assert closedloop_envs.replay(env, episodes) == 90
        car = env.unwrapped.car
        poses.append((*car.hull.position, car.hull.angle, env.unwrapped.tile_visited_count))
    assert poses[0] == poses[1] == poses[2]
    assert poses[0][3] >= 5  # it drove: tiles visited in 30 steps of the second track


def test_fewer_eval_episodes_than_cars_is_refused_in_one_line(capsys):
    """A K-car row with fewer than K episodes would drive fewer cars than its label says."""
    assert main(["bench", "closedloop", "--envs", "1", "8", "--eval-episodes", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("drive bench closedloop: error: --eval-episodes 4 is below --envs 8") and "\n" not in err


def test_a_collect_row_of_zero_cars_is_refused_in_one_line(capsys):
    """`--collect-envs 0` would time `--envs 0` again under another label."""
    assert main(["bench", "closedloop", "--collect-envs", "4", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("drive bench closedloop: error: --collect-envs: cars per process") and "\n" not in err


def test_round_ranges_bracket_each_ratio_and_pair_env_rows_by_round():
    """Env rows pair round by round, a collect or eval row meets each round of its env row; the ratio of the sums
    lies in the range; a skipped row gives no range."""
    from drive.studies.closedloop.envs import Row

    def env(label: str, cpu: list[float]) -> Row:  # 100 steps per round
        return Row(
            label, 100 * len(cpu), sum(cpu), sum(cpu), detail={"per_round_steps_per_cpu_s": [100 / c for c in cpu]}
        )

    rows = {"stock": env("s", [1.0, 1.0]), "renderer": env("r", [0.1, 0.2]), "envpool": env("e", [0.1, 0.1]),
            "stock_driving": env("sd", [1.0, 1.0]), "renderer_driving": env("rd", [0.1, 0.1]),
            "envpool_driving": Row("ed", skipped="no envpool"), "state_driving": env("st", [0.01, 0.01]),
            "collect1": Row("c1", 300, 0.5, 0.5), "collect2": Row("c2", 300, 0.3, 0.6),
            "eval_k1": Row("e1", 100, 1.0, 1.0), "eval_k4": Row("e4", 100, 0.5, 0.5),
            "eval2": Row("e2", 200, 0.5, 1.0)}  # fmt: skip
    ranges, ratios = closedloop.round_ranges(rows, (1, 4)), closedloop.ratios_of(rows, (1, 4))
    assert ranges["renderer_over_envpool"] == pytest.approx([0.5, 1.0])  # round 1: 1000 / 1000, round 2: 500 / 1000
    assert ranges["eval_best_over_renderer"] == pytest.approx([0.2, 0.4])  # K = 4: 200 against 1000 and 500
    assert ranges["renderer_over_envpool_driving"] is None and ranges["state_over_envpool_driving"] is None
    for key, span in ranges.items():
        if span is not None:
            assert span[0] <= ratios[key] + 1e-12 and ratios[key] <= span[1] + 1e-12, key


def test_loop_ratios_divide_by_our_env_measured_beside_them():
    """A loop row with `beside` measurements is divided by them (summed), its rounds paired with theirs; without,
    by the env row; the network ceiling is env / (env + call / K) on the laps beside the best eval row."""
    from drive.studies.closedloop.envs import Row

    def env(label: str, cpu: list[float]) -> Row:  # 100 steps per round
        return Row(
            label, 100 * len(cpu), sum(cpu), sum(cpu), detail={"per_round_steps_per_cpu_s": [100 / c for c in cpu]}
        )

    near = {"renderer": [[100, 0.1], [100, 0.2]], "renderer_driving": [[100, 0.2], [100, 0.2]]}
    rows = {"stock": env("s", [1.0]), "renderer": env("r", [0.5]), "envpool": env("e", [0.1]),
            "stock_driving": env("sd", [1.0]), "renderer_driving": env("rd", [0.5]),
            "envpool_driving": env("ed", [0.1]), "state_driving": env("st", [0.01]),
            "collect1": Row("c1", 200, 0.6, 0.6, detail={"per_round_steps_per_cpu_s": [400.0, 250.0], "beside": near}),
            "collect2": Row("c2", 200, 0.3, 0.6), "eval_k4": Row("e4", 100, 0.5, 0.5, detail={"beside": near}),
            "eval2": Row("e2", 200, 0.5, 1.0)}  # fmt: skip
    ratios, ranges = closedloop.ratios_of(rows, (4,)), closedloop.round_ranges(rows, (4,))
    assert ratios["collect1_over_renderer"] == pytest.approx((200 / 0.6) / (200 / 0.3))  # beside: 200 steps, 0.3 s
    assert ranges["collect1_over_renderer"] == pytest.approx([0.4, 0.5])  # 400 / 1000, 250 / 500, round by round
    assert ratios["eval_best_over_renderer_driving"] == pytest.approx(200 / 500)
    assert ranges["eval_best_over_renderer_driving"] == pytest.approx([0.4, 0.4])  # before and after, both 500
    assert ratios["renderer_driving_over_renderer"] == pytest.approx(1.0)  # the env rows, not a loop's beside
    del rows["eval_k4"].detail["beside"]
    assert closedloop.ratios_of(rows, (4,))["eval_best_over_renderer"] == pytest.approx(200 / 200)  # the env row
    rows["eval_k4"].detail["beside"] = near  # laps beside it: 500 steps/CPU-s, 2000 us a step
    assert closedloop.network_ceiling(rows, (4,), {"back_to_back": 2.0}) == pytest.approx(2000 / (2000 + 500))
    assert closedloop.network_ceiling(rows, (4,), "not measured") is None


def test_a_verdict_is_within_noise_only_where_the_rounds_straddle_the_target():
    """All rounds at or above the target: met; all below: MISSED; some of each: the run does not decide it."""
    assert closedloop.verdict(1.02, 1.0, [1.0, 1.05]) == "met"
    assert closedloop.verdict(0.95, 1.0, [0.9, 0.99]) == "MISSED"
    assert closedloop.verdict(1.01, 1.0, [0.93, 1.06]) == "met, within noise"
    assert closedloop.verdict(0.96, 1.0, [0.88, 1.03]) == "MISSED, within noise"
    assert closedloop.verdict(1.8, 1.7, None) == "met"  # a wall-clock ratio has no rounds
    assert closedloop.verdict(None, 1.0, None) == "" and closedloop.verdict(5.0, None, [4.0, 6.0]) == ""
