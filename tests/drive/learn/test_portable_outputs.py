"""No output names a folder of the machine that made it: every JSON a training run writes under an absolute --out
is free of that path (plots are named relative to the run directory)."""

from __future__ import annotations

from drive.cli import main


def test_a_training_run_writes_no_absolute_path(tmp_path):
    out = tmp_path / "run"
    assert out.is_absolute()
    assert main(["train", "--controller", "gmle", "--task", "spiral", "--epochs", "1", "--out", str(out),
                 "--no-progress", "--threads", "1"]) == 0  # fmt: skip
    written = sorted(out.rglob("*.json"))
    assert written, "the run wrote no JSON"
    for path in written:
        assert str(tmp_path) not in path.read_text(), f"{path.name} names {tmp_path}"
    assert (out / "decomposition.png").is_file()
