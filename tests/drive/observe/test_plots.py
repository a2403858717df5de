"""Plots of an interpretability trace: every drawn line is named, the steering band stays in the action's range,
and no title carries an absolute path of the machine."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from drive.observe.plots import MAP_PANELS, _pyplot, plot_trace, trace_figures
from drive.observe.trace import portable_path, portable_spec, read_trace, write_trace
from sim_bridges.carracing.bridge import ACTION_NAMES

N_HEADS, T = 4, 60
ELSEWHERE = "/opt/elsewhere/models/carracing_nsac.pt"  # an absolute path outside the working directory


def _trace(path, policy=f"ckpt:{ELSEWHERE}"):
    rng = np.random.default_rng(0)
    angle = np.linspace(0, 2 * np.pi, T)
    rows = []
    for t in range(T):
        row = {"seed": 7, "t": t, "x": 50 * np.cos(angle[t]), "y": 50 * np.sin(angle[t]), "fallback": "off",
               "fallback_threshold": float("nan"), "mean_steer": 0.8 if t < T // 2 else -0.9}  # fmt: skip
        for a in ACTION_NAMES:
            row.setdefault(f"mean_{a}", 0.5)
            row[f"aleatoric_var_{a}"] = 0.25  # 2 sigma = 1.0: the band runs far past [-1, 1] without the cut
            row[f"epistemic_var_{a}"] = 1e-5
            row[f"expert_{a}"] = 0.0
            row[f"action_{a}"] = 0.0
        for gate in ("kappa", "phi", "psi", "mu", "sigma2"):
            heads = rng.random(N_HEADS)
            row.update({f"{gate}_h{i}": float(v) for i, v in enumerate(heads)}, **{gate: float(heads.mean())})
        rows.append(row)
    return write_trace(path, rows, {"seed": 7, "policy": policy, "track": np.c_[np.cos(angle), np.sin(angle)].tolist()})


@pytest.fixture
def figures(tmp_path):
    figs = trace_figures(_trace(tmp_path / "trace_seed000007.parquet"))
    yield figs
    for fig in figs.values():
        _pyplot().close(fig)  # the Agg pyplot the plots use (never a GUI backend in a test)


def test_each_head_has_its_own_legend_entry(figures):
    ax = figures["timeseries"].axes[2]  # steer, epistemic, then kappa
    assert ax.get_ylabel() == "kappa"
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels == [f"head {i}" for i in range(N_HEADS)] + ["mean over heads"]
    assert len(ax.get_lines()) == len(labels)  # one entry per drawn line, none unnamed


def test_the_steering_band_and_axis_stay_in_the_steering_range(figures):
    ax = figures["timeseries"].axes[0]
    assert ax.get_ylabel() == "steer"
    [band] = ax.collections
    ys = np.concatenate([path.vertices[:, 1] for path in band.get_paths()])
    assert ys.min() == pytest.approx(-1.0) and ys.max() == pytest.approx(1.0)  # mean +- 1.0 reaches +-1.9 uncut
    low, high = ax.get_ylim()
    assert -1.1 <= low < -1.0 and 1.0 < high <= 1.1


def test_the_map_title_names_the_checkpoint_file_not_the_machines_path(figures, tmp_path):
    title = figures["map"]._suptitle.get_text()
    assert "ckpt:carracing_nsac.pt" in title and "/opt" not in title
    # and the files plot_trace writes are these figures
    paths = plot_trace(tmp_path / "trace_seed000007.parquet")
    assert [p.name for p in paths] == ["trace_seed000007_map.png", "trace_seed000007_timeseries.png"]


def test_portable_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert portable_path(tmp_path / "runs" / "best.pt") == "runs/best.pt"  # inside the working directory
    assert portable_path(ELSEWHERE) == "carracing_nsac.pt"  # absolute elsewhere: the file name
    assert portable_path("../shared/best.pt") == "../shared/best.pt"  # relative: as typed
    assert portable_spec(f"ckpt:{tmp_path}/runs/best.pt") == "ckpt:runs/best.pt"
    assert portable_spec("expert:ppo") == "expert:ppo"
    assert portable_spec(ELSEWHERE) == "carracing_nsac.pt"  # a policy named by its bare path
    assert portable_spec("") == ""


def test_the_recorder_stores_no_absolute_path(tmp_path):
    from drive.loop.envs import make_env
    from drive.loop.rollout import rollout
    from drive.loop.specs import make_policy
    from drive.observe.trace_recorder import TraceRecorder

    env = make_env("fake-road", max_episode_steps=5)
    recorder = TraceRecorder(tmp_path, env=env, plots=False, policy_name=f"expert:{ELSEWHERE}")
    rollout(env, make_policy("expert:pursuit", "fake-road"), seeds=[3], on_step=recorder)
    env.close()
    _, meta = read_trace(recorder.paths[0])
    assert meta["policy"] == "expert:carracing_nsac.pt"


def test_the_maps_sit_in_a_readable_grid_with_the_key_off_the_track(figures, tmp_path):
    # they used to be a 1890x378 strip of five small maps, each with its legend drawn over the track
    fig = figures["map"]
    fig.canvas.draw()
    maps = [ax for ax in fig.axes if ax.get_title()]  # not the colour bars nor the key's cell
    assert [ax.get_title() for ax in maps] == [title for _, title in MAP_PANELS]
    assert all(ax.collections for ax in maps)  # the car's coloured points
    legends = [legend for ax in fig.axes if (legend := ax.get_legend()) is not None] + fig.legends
    assert legends, "the track, car and threshold key is drawn"
    for legend in legends:
        box = legend.get_window_extent()
        assert not any(box.overlaps(ax.get_window_extent()) for ax in maps), "a key covers a map"
    png = plot_trace(tmp_path / "trace_seed000007.parquet")[0]
    width, height = Image.open(png).size
    assert 0.4 <= height / width <= 1.5, (width, height)
    assert min(ax.get_window_extent().width for ax in maps) >= 0.2 * fig.bbox.width  # each map a cell, not a sliver
