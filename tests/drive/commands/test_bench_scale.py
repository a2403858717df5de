"""`drive bench scale`: the plan alternates the variants' order over rounds, ratios are paired within a round, a
run's start-up is split from its work, and a tiny run warms up untimed and reports start-up apart from frames/s.
Speeds are a benchmark's, never asserted here."""

from __future__ import annotations

import json
import statistics
import sys

import pytest

from drive.cli import main
from drive.commands.bench import scale as command
from drive.errors import UserError
from drive.loop import collect as collect_module
from drive.studies import scale

TINY = ["--env", "fake-road", "--expert", "pursuit", "--episodes", "2", "--max-episode-steps", "30",
        "--train-episodes", "3"]  # fmt: skip


def test_rounds_alternate_the_order_and_keep_the_ray_variants_together():
    orders = scale.round_orders(list(scale.COLLECTION), 4)
    assert orders[0] == ("pool1", "pool2", "ray1", "ray2") == orders[2]
    assert orders[1] == ("ray2", "ray1", "pool2", "pool1") == orders[3]
    for a, b in (("pool1", "pool2"), ("ray1", "ray2")):  # each ratio's sides swap places from round to round
        first = [order.index(a) < order.index(b) for order in orders]
        assert first == [True, False, True, False]
    for order in orders:  # one Ray instance per round serves both Ray variants
        on_ray = [i for i, key in enumerate(order) if scale.COLLECTION[key][1]]
        assert on_ray == list(range(on_ray[0], on_ray[0] + 2))
    assert scale.round_orders(["a"], 1) == [("a",)]


def test_ratios_are_taken_within_each_round_not_from_the_medians():
    rounds = [{"one": 100.0, "two": 200.0}, {"one": 50.0, "two": 150.0}, {"one": 120.0, "two": 144.0}, {"two": 9.0}]
    figures, ratios = scale.summarise(rounds, {"two_over_one": ("two", "one"), "none": ("two", "three")})
    assert figures["one"] == scale.Spread(100.0, 50.0, 120.0, (100.0, 50.0, 120.0))
    assert figures["two"].median == pytest.approx(147.0) and figures["two"].rounds == (200.0, 150.0, 144.0, 9.0)
    paired = ratios["two_over_one"]  # 2.0, 3.0 and 1.2; round 4 has no "one"
    assert paired.rounds == pytest.approx((2.0, 3.0, 1.2))
    assert (paired.median, paired.low, paired.high) == pytest.approx((2.0, 1.2, 3.0))
    assert figures["two"].median / figures["one"].median == pytest.approx(1.47)  # what a ratio of medians says
    assert "none" not in ratios  # never measured together: no ratio, rather than a made-up one
    assert scale.verdict(paired, 1.6) == "met, within noise" and scale.verdict(paired, 1.1) == "met"
    assert scale.verdict(paired, 3.5) == "MISSED" and scale.verdict(paired, None) == ""


def test_a_run_splits_into_startup_and_work_from_its_episodes_timings():
    episodes = [  # two worker processes; the second started stepping half a second after the first
        {"seed": 0, "pid": 11, "first": 104.0, "last": 108.0, "first_cpu": 3.0, "last_cpu": 6.5, "steps": 400},
        {"seed": 1, "pid": 12, "first": 104.5, "last": 109.0, "first_cpu": 2.0, "last_cpu": 5.0, "steps": 450},
        {"seed": 2, "pid": 11, "first": 108.1, "last": 112.0, "first_cpu": 6.6, "last_cpu": 9.0, "steps": 350},
    ]
    run = scale.timeline("pool2", 1, 100.0, 113.0, episodes, (0.5, 0.7))
    assert (run.startup_s, run.stagger_s, run.work_s, run.wall_s) == pytest.approx((4.0, 0.5, 8.0, 13.0))
    assert run.frames == 1200 and run.processes == 2 and run.round == 1
    assert run.frames_per_s == pytest.approx(150.0)  # frames over the work: start-up and teardown left out
    assert run.wall_frames_per_s == pytest.approx(1200 / 13) and run.startup_share == pytest.approx(4 / 13)
    assert run.cpu_s == pytest.approx(6.0 + 3.0)  # each process from its first step to its last, resets included
    assert run.frames_per_cpu_s == pytest.approx(1200 / 9) and run.cores == pytest.approx(9 / 8)
    assert run.to_dict()["frames_per_s"] == pytest.approx(150.0) and run.to_dict()["cores"] == pytest.approx(9 / 8)


def test_a_note_says_when_the_two_worker_runs_did_not_get_two_cores():
    def cores(median: float) -> scale.Spread:
        return scale.Spread(median, median, median, (median,))

    assert scale.shared_note({"pool1": cores(0.7), "pool2": cores(1.9), "ray2": cores(1.85)}) == ""
    note = scale.shared_note({"pool1": cores(1.0), "pool2": cores(1.32), "ray1": cores(0.9), "ray2": cores(1.9)})
    assert "pool2 1.32 cores of 2" in note and "ray2" not in note and "_per_cpu" in note


def test_tiny_run_warms_up_untimed_and_reports_startup_apart_from_throughput(tmp_path, monkeypatch):
    calls, real = [], collect_module.collect

    def spy(opts, recorder):
        calls.append((opts, recorder))
        return real(opts, recorder)

    monkeypatch.setattr(collect_module, "collect", spy)
    out = tmp_path / "scale.json"
    assert main(["bench", "scale", *TINY, "--repeats", "2", "--skip", "ray", "train", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    # the warm-up: first, in this process, recording the training episodes with the plain recorder; not a timed run
    warm, *timed = calls
    assert warm[0].workers == 1 and warm[0].ray is None and warm[0].seeds == "6000-6002"
    assert not isinstance(warm[1], scale.TimedRecorder) and set(results["warm_up_s"]) == {"local_s"}
    assert [(o.workers, o.ray) for o, _ in timed] == [(1, None), (2, None), (2, None), (1, None)]
    assert all(isinstance(r, scale.TimedRecorder) for _, r in timed)
    runs = results["collection"]["runs"]
    assert [(r["round"], r["variant"]) for r in runs] == [(0, "pool1"), (0, "pool2"), (1, "pool2"), (1, "pool1")]
    assert results["collection"]["ray_starts"] == []
    for r in runs:  # start-up apart from the work; frames/s over the work alone
        assert r["frames"] > 0 and r["startup_s"] >= 0 and r["work_s"] > 0 and r["stagger_s"] >= 0
        assert r["startup_s"] + r["work_s"] <= r["wall_s"]
        assert r["frames_per_s"] == pytest.approx(r["frames"] / r["work_s"])
        assert r["wall_frames_per_s"] == pytest.approx(r["frames"] / r["wall_s"])
        assert r["startup_share"] == pytest.approx(r["startup_s"] / r["wall_s"])
        assert r["cpu_s"] > 0 and r["frames_per_cpu_s"] == pytest.approx(r["frames"] / r["cpu_s"])
    assert {r["processes"] for r in runs if r["variant"] == "pool1"} == {1}
    fps = results["collection"]["frames_per_s"]["pool2"]
    assert fps["rounds"] == [runs[1]["frames_per_s"], runs[2]["frames_per_s"]]
    assert fps["median"] == pytest.approx(statistics.median(fps["rounds"]))
    assert set(results["collection"]["startup_s"]) == {"pool1", "pool2"}
    ratio = results["ratios"]["pool2_over_pool1"]  # paired within each round
    assert ratio["rounds"] == pytest.approx([runs[1]["frames_per_s"] / runs[0]["frames_per_s"],
                                             runs[2]["frames_per_s"] / runs[3]["frames_per_s"]])  # fmt: skip
    assert ratio["low"] <= ratio["median"] <= ratio["high"]
    assert set(results["ratios"]) == {"pool2_over_pool1", "pool2_over_pool1_wall", "pool2_over_pool1_per_cpu"}
    assert results["training"] == {"runs": [], "samples_per_s": {}} and results["verdicts"] == {}


@pytest.mark.parametrize("argv, message", [(["--episodes", "3"], "even"), (["--train-episodes", "2"], ">= 3"),
                                           (["--skip", "gpu"], "choose from")])  # fmt: skip
def test_bad_options_are_refused_before_anything_runs(argv, message, monkeypatch):
    from tyro import cli

    monkeypatch.setattr(scale, "warm_up", lambda *a: pytest.fail("ran"))
    with pytest.raises(UserError, match=message):
        command.run(cli(command.Config, args=argv))


def test_without_ray_the_run_is_refused_at_once_and_points_to_skip_ray(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as where the `distributed` extra is missing
    monkeypatch.setattr(scale, "warm_up", lambda *a: pytest.fail("ran"))
    with pytest.raises(UserError, match="pip install.*--skip ray"):
        command.run(command.Config())


@pytest.mark.slow
def test_tiny_run_with_ray_and_training(tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "scale.json"
    assert main(["bench", "scale", *TINY, "--repeats", "2", "--epochs", "1", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    collection = ("pool1", "pool2", "ray1", "ray2")
    planned = [(0, k) for k in collection] + [(1, k) for k in reversed(collection)]
    assert [(r["round"], r["variant"]) for r in results["collection"]["runs"]] == planned
    starts = results["collection"]["ray_starts"]  # one Ray instance per round, up before its Ray variants
    assert [s["round"] for s in starts] == [0, 1] and all(s["startup_s"] > 0 for s in starts)
    assert results["collection"]["startup_s"]["ray_start"]["rounds"] == [s["startup_s"] for s in starts]
    assert {r["processes"] for r in results["collection"]["runs"] if r["variant"] == "ray2"} <= {1, 2}
    training = ("ddp1", "ddp2", "threads2")
    planned = [(0, k) for k in training] + [(1, k) for k in reversed(training)]
    assert [(r["round"], r["variant"]) for r in results["training"]["runs"]] == planned
    assert set(results["ratios"]) >= set(scale.TARGETS) and set(results["verdicts"]) == set(scale.TARGETS)
    assert len(results["ratios"]["ddp2_over_ddp1"]["rounds"]) == 2
