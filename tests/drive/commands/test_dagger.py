"""`drive dagger`'s summary: a finished round rerun says it is complete and repeats the first run's figures."""

from __future__ import annotations

import re
import warnings

from drive.cli import main


def _tiny_clone(path) -> None:
    import torch

    from agents.encoders import EncoderConfig
    from agents.nsac import NSACConfig
    from agents.registry import config_to_dict
    from drive import checkpoint

    torch.manual_seed(0)
    cfg = NSACConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=2)
    checkpoint.save(path, kind="controller", name="nsac", config=config_to_dict(cfg), module=cfg.build())


def test_rerun_of_a_finished_round_repeats_its_summary_without_warnings(tmp_path, capsys):
    demos, clone, out = tmp_path / "demos", tmp_path / "clone.pt", tmp_path / "d1"
    assert main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-2", "--out", str(demos),
                 "--max-episode-steps", "30", "--min-return", "-1000", "--no-progress"]) == 0  # fmt: skip
    _tiny_clone(clone)
    dagger = ["dagger", "--ckpt", str(clone), "--data", str(demos), "--out", str(out), "--seeds", "50-51", "--env",
              "fake-road", "--max-episode-steps", "30", "--beta", "0.3", "--workers", "1", "--no-progress"]  # fmt: skip
    capsys.readouterr()
    assert main(dagger) == 0
    first = capsys.readouterr().out.strip().splitlines()
    assert len(first) == 1 and re.match(r"2 DAgger episode\(s\) \(60 frames, .* 60 expert labels\) \+ the 3 ", first[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "mean of empty slice" was the symptom
        assert main(dagger) == 0
    again = capsys.readouterr()
    assert again.out.strip().splitlines() == [f"{out} is already complete: nothing recorded", first[0]]
    assert "nan" not in again.out and again.err == ""


def test_a_round_records_the_same_episodes_for_any_cars_per_process(tmp_path):
    """--envs 1 and --envs 3 (lanes; the clone answers all cars in one call, the mixing coin is per episode)."""
    from datasets.demonstrations import read_manifest

    demos, clone = tmp_path / "demos", tmp_path / "clone.pt"
    assert main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-1", "--out", str(demos),
                 "--max-episode-steps", "20", "--min-return", "-1000", "--no-progress"]) == 0  # fmt: skip
    _tiny_clone(clone)
    shards = {}
    for k in (1, 3):
        out = tmp_path / f"k{k}"
        assert main(["dagger", "--ckpt", str(clone), "--data", str(demos), "--out", str(out), "--seeds", "50-53",
                     "--env", "fake-road", "--max-episode-steps", "25", "--beta", "0.5", "--workers", "1", "--envs",
                     str(k), "--no-progress"]) == 0  # fmt: skip
        shards[k] = {e["seed"]: e["sha256"] for e in read_manifest(out)["episodes"] if e["seed"] >= 50}
    assert len(shards[1]) == 4 and shards[1] == shards[3]
