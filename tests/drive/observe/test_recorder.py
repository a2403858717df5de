"""Interpretability recorder: the trace holds what the model really computed, in tidy columns, with plots."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from agents.encoders import EncoderConfig
from agents.nsac import NSACConfig
from agents.registry import config_to_dict
from datasets.frames import ObservationCoder
from drive import checkpoint
from drive.loop.envs import make_env
from drive.loop.rollout import rollout
from drive.loop.specs import controller_policy as load_controller_policy
from drive.observe.trace import observation_stacks, read_trace
from drive.observe.trace_recorder import TraceRecorder

N_HEADS = 2


@pytest.fixture(scope="module")
def nsac_ckpt(tmp_path_factory):
    torch.manual_seed(0)
    cfg = NSACConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=N_HEADS)
    model = cfg.build()
    with torch.no_grad():  # untrained tokens are nearly input-independent; a larger gain makes the gates move
        model.encoder.cnn[-2].weight.mul_(40.0)
    path = tmp_path_factory.mktemp("ckpt") / "nsac.pt"
    checkpoint.save(path, kind="controller", name="nsac", config=config_to_dict(cfg), module=model)
    return path


class ExpertDrives:
    """The untrained controller predicts (and is recorded) every step while its shadow expert drives, so the car
    moves and the frames change."""

    def __init__(self, policy):
        self.policy = policy

    def reset(self, seed=None):
        self.policy.reset(seed)

    def act(self, obs, info):
        out = self.policy.act(obs, info)
        return dataclasses.replace(out, action=out.expert, source="expert")


def _record(ckpt, out_dir, env_name="fake-road", steps=25, seed=5, plots=True):
    policy = ExpertDrives(load_controller_policy(ckpt, samples=8, shadow="pursuit", env=env_name))
    env = make_env(env_name, max_episode_steps=steps)
    recorder = TraceRecorder(out_dir, env=env, policy_name="test", plots=plots)
    seen = []
    coder = ObservationCoder.from_fingerprint(checkpoint.read(ckpt)["data"], 4)  # the controller's input, rebuilt
    rollout(env, policy, seeds=[seed], on_step=[recorder, lambda r: seen.append((coder(r.obs)[0].numpy(), r.output))])
    env.close()
    return recorder.paths[0], seen


@pytest.fixture(scope="module")
def fake_trace(nsac_ckpt, tmp_path_factory):
    return _record(nsac_ckpt, tmp_path_factory.mktemp("trace"))


def test_recorded_kappa_phi_psi_equal_the_models_values_for_the_same_input(nsac_ckpt, fake_trace):
    path, seen = fake_trace
    table, meta = read_trace(path)
    assert table.num_rows == len(seen) == 25
    # the controller's inputs are rebuilt from the trace alone ...
    stacks = observation_stacks(table, meta)
    assert np.array_equal(stacks, np.stack([obs for obs, _ in seen]))
    # ... and the model run afresh on them computes exactly the recorded gates
    model, _ = checkpoint.load_controller(nsac_ckpt)
    with torch.inference_mode():
        model.moments(torch.as_tensor(stacks), 1, torch.Generator().manual_seed(0))
    fresh = {k: v.numpy() for k, v in model.internals().items()}
    for name in ("kappa", "phi", "psi", "mu", "sigma2"):
        expected = fresh[name]  # (T, H, n, K)
        recorded = np.array(table.column(f"{name}_values").to_pylist(), dtype=np.float64)
        np.testing.assert_allclose(recorded, expected.reshape(len(stacks), -1), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(table.column(name).to_numpy(), expected.mean((1, 2, 3)), rtol=1e-4, atol=1e-6)
        for h in range(N_HEADS):
            per_head = table.column(f"{name}_h{h}").to_numpy()
            np.testing.assert_allclose(per_head, expected[:, h].mean((1, 2)), rtol=1e-4, atol=1e-6)
        assert meta["internals"][name]["shape"] == list(expected.shape[1:])
    # the gates depend on the input: they change along the episode
    for name in ("kappa", "phi", "psi"):
        assert np.ptp(table.column(name).to_numpy()) > 1e-3, name
    assert (table.column("kappa").to_numpy() > 0).all() and (table.column("psi").to_numpy() > 0).all()


def test_trace_columns_match_the_policy_outputs(fake_trace):
    path, seen = fake_trace
    table, meta = read_trace(path)
    expected_columns = {
        "seed", "t", "reward", "return", "x", "y", "heading", "speed", "progress", "off_track", "track_pos",
        "action_steer", "action_gas", "action_brake", "mean_steer", "aleatoric_var_steer", "epistemic_var_steer",
        "expert_steer", "expert_gas", "expert_brake", "latency_ms", "fallback", "attention", "attention_values",
        "obs_frame", "frame",
    }  # fmt: skip
    assert expected_columns <= set(table.column_names)
    assert table.column("t").to_pylist() == list(range(len(seen)))
    outputs = [o for _, o in seen]
    np.testing.assert_allclose(table.column("mean_steer").to_numpy(), [o.prediction.mean[0] for o in outputs],
                               rtol=1e-6)  # fmt: skip
    np.testing.assert_allclose(table.column("expert_gas").to_numpy(), [o.expert[1] for o in outputs], rtol=1e-6)
    np.testing.assert_allclose(table.column("epistemic_var_brake").to_numpy(),
                               [o.prediction.epistemic_var[2] for o in outputs], rtol=1e-6)  # fmt: skip
    # attention weights: (S, H, n, K) per step, rows summing to one
    attention = np.array(table.column("attention_values").to_pylist()).reshape(len(seen), *meta["internals"]
                                                                               ["attention"]["shape"])  # fmt: skip
    np.testing.assert_allclose(attention.sum(-1), 1.0, rtol=1e-5)
    assert attention.shape[1] == 8  # S samples recorded
    assert meta["frame_shape"] == [96, 96, 3]
    assert (table.column("return").to_numpy()[-1]) == pytest.approx(float(np.sum(table.column("reward").to_numpy())))
    assert path.with_name(path.stem + "_timeseries.png").stat().st_size > 10_000
    assert path.with_name(path.stem + "_map.png").stat().st_size > 10_000


def test_carracing_trace_has_the_track_and_track_position(nsac_ckpt, tmp_path):
    path, _ = _record(nsac_ckpt, tmp_path, env_name="carracing", steps=15, seed=7, plots=False)
    table, meta = read_trace(path)
    track = np.asarray(meta["track"])
    assert track.ndim == 2 and track.shape[1] == 2 and len(track) > 100
    pos = table.column("track_pos").to_numpy()
    assert np.all((pos >= 0) & (pos < 1))
    # the car starts on the track: its position is one of the first tiles (or the last, wrapping)
    assert min(pos[0], 1 - pos[0]) < 0.05
    xy = np.stack([table.column("x").to_numpy(), table.column("y").to_numpy()], 1)
    assert np.min(np.linalg.norm(track - xy[0], axis=1)) < 10.0


def test_read_trace_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.parquet"
    with pytest.raises(ValueError, match="nope.parquet"):
        read_trace(missing)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="garbage.parquet"):
        read_trace(garbage)
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"t": [0, 1]}), plain)
    with pytest.raises(ValueError, match="plain.parquet.*metadata"):
        read_trace(plain)
    lacking = tmp_path / "lacking.parquet"
    pq.write_table(pa.table({"t": [0]}).replace_schema_metadata({b"drive": json.dumps({}).encode()}), lacking)
    with pytest.raises(ValueError, match="lacking.parquet.*mean_steer"):
        read_trace(lacking)
