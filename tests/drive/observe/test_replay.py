"""`drive replay` and `drive drive` (headless): the overlay on every frame, one video frame per recorded step."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from agents.encoders import EncoderConfig
from agents.nsac import NSACConfig
from agents.registry import config_to_dict
from drive import checkpoint
from drive.cli import main
from drive.loop.envs import make_env
from drive.loop.rollout import rollout
from drive.loop.specs import controller_policy as load_controller_policy
from drive.observe.overlay import BLUE, PANEL_WIDTH, OverlayState, draw_overlay
from drive.observe.trace import read_trace
from drive.observe.trace_recorder import TraceRecorder
from drive.observe.video import read_video

STEPS = 30


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(1)
    cfg = NSACConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=2)
    path = tmp_path_factory.mktemp("ckpt") / "nsac.pt"
    checkpoint.save(path, kind="controller", name="nsac", config=config_to_dict(cfg), module=cfg.build())
    return path


@pytest.fixture(scope="module")
def trace(ckpt, tmp_path_factory):
    policy = load_controller_policy(ckpt, samples=4, shadow="pursuit", env="fake-road")
    env = make_env("fake-road", max_episode_steps=STEPS)
    recorder = TraceRecorder(tmp_path_factory.mktemp("trace"), env=env, plots=False)
    rollout(env, policy, seeds=[2], on_step=recorder)
    return recorder.paths[0]


def test_replay_writes_one_overlay_frame_per_step(trace, tmp_path):
    out = tmp_path / "replay.mp4"
    assert main(["replay", str(trace), "--out", str(out)]) == 0
    video = read_video(out)
    table, _ = read_trace(trace)
    assert len(video) == table.num_rows == STEPS
    assert video.shape[1:] == (420, 420 + PANEL_WIDTH, 3)
    # the panel is drawn (not blank) and the frame beside it is the recorded raw frame, upscaled
    assert video[0][:, 420:].std() > 10
    raw = np.frombuffer(table.column("frame")[0].as_py(), np.uint8).reshape(96, 96, 3)
    first = video[0][:420, :420].astype(float)
    assert np.abs(first[::35, ::35].mean() - raw.astype(float).mean()) < 12  # mp4 is lossy: compare coarsely
    half = tmp_path / "half.mp4"
    assert main(["replay", str(trace), "--out", str(half), "--every", "2"]) == 0
    assert len(read_video(half)) == (STEPS + 1) // 2


def test_replay_errors_name_the_trace(tmp_path, capsys):
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"t": [0]}), plain)
    assert main(["replay", str(plain), "--out", str(tmp_path / "x.mp4")]) == 2
    assert "plain.parquet" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing.parquet"), "--out", str(tmp_path / "x.mp4")]) == 2
    assert "missing.parquet" in capsys.readouterr().err
    assert not (tmp_path / "x.mp4").exists()


def _state(**kw):
    base = dict(mean=(0.1, 0.5, 0.0), aleatoric_var=(0.01, 0.01, 0.001), epistemic_var=(0.002, 0.001, 0.0),
                expert=(0.3, 0.5, 0.0), kappa=1.0, phi=0.2, psi=0.5)  # fmt: skip
    return OverlayState(**{**base, **kw})


def test_overlay_shows_what_changes():
    frame = np.full((96, 96, 3), 100, np.uint8)
    base = draw_overlay(frame, _state(fallback="controller"))
    engaged = draw_overlay(frame, _state(fallback="expert"))
    wider = draw_overlay(frame, _state(fallback="controller", epistemic_var=(0.2, 0.001, 0.0)))
    moved = draw_overlay(frame, _state(fallback="controller", expert=(-0.8, 0.5, 0.0)))
    for other in (engaged, wider, moved):
        assert other.shape == base.shape
        assert np.any(other[:, 420:] != base[:, 420:])
    assert np.array_equal(base[:, :420], engaged[:, :420])  # the panel changes, the driving frame does not
    gray = draw_overlay(np.zeros((84, 84), np.uint8), _state(kappa=None, phi=None, psi=None))
    assert gray.shape == base.shape
    with pytest.raises(ValueError, match="frame"):
        draw_overlay(np.zeros((4, 84, 84), np.uint8), _state())


def test_overlay_steering_band_stays_on_the_steering_axis():
    """A band of mean -0.67 +- 1.12 (as the shipped NSAC shows on track 1000) is cut at -1, the axis' end."""
    frame = np.full((96, 96, 3), 100, np.uint8)
    panel = draw_overlay(frame, _state(mean=(-0.67, 0.5, 0.0), aleatoric_var=(0.31, 0.01, 0.0)))[:, 420:]
    blue = np.all(panel == BLUE, axis=2)
    rows = np.flatnonzero(blue.any(axis=1))
    assert rows.size > 0
    cols = np.flatnonzero(blue[rows].any(axis=0))
    x0, x1 = 20, PANEL_WIDTH - 20  # the [-1, 1] axis of drive/observe/overlay.py
    assert cols.min() == x0  # reaches -1 and stops there (uncut it would start 0.79 further left, off the panel)
    assert cols.max() == round(x0 + (-0.67 + 2 * np.sqrt(0.31 + 0.002) + 1) / 2 * (x1 - x0))


def test_drive_headless_writes_the_video_and_trace(ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    out = tmp_path / "live.mp4"
    code = main(["drive", "--ckpt", str(ckpt), "--env", "fake-road", "--shadow", "pursuit", "--seeds", "4",
                 "--max-episode-steps", "20", "--video", str(out), "--trace", str(tmp_path / "tr"),
                 "--samples", "4"])  # fmt: skip
    assert code == 0
    assert len(read_video(out)) == 20
    table, _ = read_trace(tmp_path / "tr" / "trace_seed000004.parquet")
    assert table.num_rows == 20
    assert main(["drive", "--expert", "ppo"]) == 2
