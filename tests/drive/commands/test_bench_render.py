"""`drive bench render --breakdown`: every stage timed, nested stages within their parent, the timers removed after.
Speeds are a benchmark's, never asserted here."""

from __future__ import annotations

from drive.cli import main
from drive.commands.bench import render


def test_breakdown_times_every_stage_within_its_parent_and_unpatches():
    from sim_bridges.carracing import raster, shrink

    kernels = (raster.draw_world, shrink.shrink_rows)
    stages = render.breakdown(12, 5000)
    assert [label for _, label, _ in stages] == [label for _, label, _, _ in render.STAGES]
    assert all(us > 0 for _, _, us in stages)
    for i, (depth, label, us) in enumerate(stages):  # a stage's direct children sum to no more than it (timers nest)
        children = []
        for d, _, u in stages[i + 1 :]:
            if d <= depth:
                break
            children += [u] if d == depth + 1 else []
        assert sum(children) <= us * 1.1, label  # slack: the bar's X shrink is timed inside two siblings
    assert (raster.draw_world, shrink.shrink_rows) == kernels  # the timers are gone


def test_bench_render_prints_the_breakdown(capsys):
    assert main(["bench", "render", "--steps", "6", "--breakdown"]) == 0
    out = capsys.readouterr().out
    assert "where a step goes" in out and "world: fills and anti-aliased edges" in out
