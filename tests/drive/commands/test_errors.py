"""Bad input, each a one-line error `drive COMMAND: error: ...`, exit code 2, no traceback, nothing executed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

from drive.cli import main
from tests.conftest import REPO

SHIPPED_NSAC = REPO / "checkpoints" / "carracing_nsac.pt"
SHIPPED_PPO = REPO / "checkpoints" / "expert_ppo.pt"


def _one_line_error(capsys, command: str) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip() and not line.startswith("WARNING")]
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"drive {command}: error: "), lines[0]
    assert "Traceback" not in captured.err and "weights_only=False" not in captured.err
    return lines[0]


class _Payload:
    """Pickled code: unpickling it would create the marker file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_carrying_pickled_code_is_refused_unrun(tmp_path, capsys):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"format": "drive-checkpoint", "payload": _Payload(str(marker))}, evil, pickle_protocol=2)
    assert main(["eval", "--ckpt", str(evil), "--seeds", "1"]) == 2
    line = _one_line_error(capsys, "eval")
    assert "evil.pt" in line and "pickled" in line
    assert not marker.exists()  # the code never ran


def test_random_bytes_as_a_checkpoint(tmp_path, capsys):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(os.urandom(4096))
    assert main(["eval", "--ckpt", str(junk), "--seeds", "1"]) == 2
    assert "junk.pt: not a readable drive checkpoint" in _one_line_error(capsys, "eval")


def test_an_expert_as_a_controller_and_the_reverse(capsys):
    assert main(["eval", "--ckpt", str(SHIPPED_PPO), "--seeds", "1"]) == 2
    assert "is an expert" in _one_line_error(capsys, "eval")
    assert main(["eval", "--expert", str(SHIPPED_NSAC), "--seeds", "1"]) == 2
    assert "is a trained controller" in _one_line_error(capsys, "eval")
    assert main(["dagger", "--ckpt", str(SHIPPED_PPO), "--data", "nowhere", "--out", "x", "--seeds", "5"]) == 2
    _one_line_error(capsys, "dagger")


def test_missing_data_path_and_unknown_controller(tmp_path, capsys):
    assert main(["train", "--controller", "nsac", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    assert "does not exist" in _one_line_error(capsys, "train")
    assert main(["train", "--controller", "nonexistent", "--out", str(tmp_path / "r")]) == 2
    assert "unknown controller 'nonexistent'" in _one_line_error(capsys, "train")
    assert not (tmp_path / "r").exists()


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "d"
    assert main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-3", "--max-episode-steps",
                 "20", "--min-return", "-1000", "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    return out


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_corrupt_manifest_and_truncated_episode(tiny_dataset, tmp_path, capsys):
    capsys.readouterr()
    corrupt = _copy(tiny_dataset, tmp_path / "corrupt")
    text = (corrupt / "manifest.json").read_text()
    (corrupt / "manifest.json").write_text(text[: len(text) // 3])
    for argv, command in ((["data", "info", str(corrupt)], "data info"),
                          (["train", "--controller", "gmle", "--data", str(corrupt), "--out", str(tmp_path / "r1")],
                           "train")):  # fmt: skip
        assert main(argv) == 2
        assert "manifest.json: corrupt or truncated manifest" in _one_line_error(capsys, command)
    truncated = _copy(tiny_dataset, tmp_path / "truncated")
    shard = truncated / "episodes" / "seed_000002.npz"
    shard.write_bytes(shard.read_bytes()[:100])
    assert main(["train", "--controller", "gmle", "--data", str(truncated), "--out", str(tmp_path / "r2"),
                 "--set", "task.val_fraction=0.25", "task.test_fraction=0.25"]) == 2  # fmt: skip
    assert "seed_000002.npz" in _one_line_error(capsys, "train")
    assert not (tmp_path / "r2" / "best.pt").exists()
    assert main(["data", "info", str(truncated)]) == 2  # sizes are compared with the manifest even without --verify
    assert "seed_000002.npz" in _one_line_error(capsys, "data info")


@pytest.mark.parametrize(
    "argv, command, needle",
    [
        (["eval", "--seeds", "5-1"], "eval", "runs backwards"),
        (["eval", "--seeds", "abc"], "eval", "bad seed spec"),
        (["collect", "--episodes", "0", "--out", "unused"], "collect", "--episodes: 0 is out of range: must be >= 1"),
        (["collect", "--episodes", "-3", "--out", "unused"], "collect", "--episodes: -3 is out of range"),
        (["collect", "--episodes", "x", "--out", "unused"], "collect", "--episodes: 'x' is not an integer"),
        (["collect", "--workers", "0", "--out", "unused"], "collect", "--workers: 0 is out of range"),
        (["collect", "--action-noise", "nan", "--out", "unused"], "collect", "--action-noise: nan is not finite"),
        (["train", "--controller", "gmle", "--batch-size", "0", "--out", "unused"], "train", "--batch-size: 0"),
        (["train", "--controller", "gmle", "--lr", "-1", "--out", "unused"], "train", "--lr: -1 is out of range"),
        (["train", "--controller", "gmle", "--epochs", "0", "--out", "unused"], "train", "--epochs: 0 is out"),
        (["eval", "--workers", "0", "--out", "unused"], "eval", "--workers: 0 is out of range"),
        (["eval", "--seeds", "0-99999999999", "--out", "unused"], "eval", "seeds"),
        (["udacity", "drive", "--port", "99999", "--run-dir", "unused"], "udacity drive", "must be in 0..65535"),
        (["udacity", "drive", "--port", "-1", "--run-dir", "unused"], "udacity drive", "--port: -1 is out of range"),
        (["udacity", "record", "--port", "70000", "--out", "unused"], "udacity record", "must be in 0..65535"),
        (
            ["dagger", "--ckpt", "c", "--data", "d", "--seeds", "5", "--beta", "2", "--out", "unused"],
            "dagger",
            "--beta: 2 is out of range",
        ),
        (["sa", "calibrate", "--ckpt", "c", "--passes", "1"], "sa calibrate", "--passes: 1 is out of range"),
        (["bench", "latency", "--samples", "0"], "bench latency", "--samples: 0 is out of range"),
        (["ood", "--ckpt", "c", "--every", "0", "--out", "unused"], "ood", "--every: 0 is out of range"),
        (["collect", "--bogus", "--out", "unused"], "collect", "unrecognized option"),
        (["train", "--controller", "gmle"], "train", "missing required option(s): --out"),
        (["eval", "--env", "mars"], "eval", "mars"),
        (["train", "--controller", "gmle", "--out", "unused", "--set", "task.n_obs=x"], "train", "not a valid int"),
    ],
)
def test_bad_option_values(argv, command, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert needle in _one_line_error(capsys, command)
    assert not (tmp_path / "unused").exists()


def test_a_file_that_is_not_parquet_to_replay(tmp_path, capsys):
    fake = tmp_path / "trace.parquet"
    fake.write_bytes(b"PAR? not parquet")
    assert main(["replay", str(fake), "--out", str(tmp_path / "v.mp4")]) == 2
    assert "trace.parquet: not a readable Parquet trace" in _one_line_error(capsys, "replay")
    assert not (tmp_path / "v.mp4").exists()


def test_a_port_that_cannot_be_bound(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["udacity", "drive", "--driver", "vision", "--port", str(port), "--display", "none",
                     "--run-dir", str(tmp_path / "run"), "--connect-timeout-s", "1"])  # fmt: skip
    assert code == 2
    assert str(port) in _one_line_error(capsys, "udacity drive")


def test_debug_shows_the_traceback_and_unexpected_errors_keep_theirs(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\0" * 10)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    one = subprocess.run([sys.executable, "-m", "drive", "eval", "--ckpt", str(junk), "--seeds", "1"],
                         capture_output=True, text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert one.returncode == 2 and "Traceback" not in one.stderr
    debug = subprocess.run([sys.executable, "-m", "drive", "--debug", "eval", "--ckpt", str(junk), "--seeds",
                            "1"], capture_output=True, text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "CheckpointError" in debug.stderr


def test_no_simulator_is_one_line_and_leaves_no_run_directory(tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["udacity", "drive", "--driver", "vision", "--port", "0", "--display", "none", "--run-dir", str(run),
                 "--connect-timeout-s", "0.5"])  # fmt: skip
    assert code == 2
    assert "no telemetry" in _one_line_error(capsys, "udacity drive")
    assert not run.exists()  # the corrected command (simulator started) finds nothing in its way


def test_a_closed_pipe_is_not_an_error(tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO

    data = tmp_path / "demos"
    assert main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0", "--max-episode-steps", "20",
                 "--min-return", "-1000", "--no-progress", "--out", str(data)]) == 0  # fmt: skip
    shell = f"{sys.executable} -m drive data info {data} --json | head -c 1"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", shell], cwd=REPO, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0 and done.stdout == "{" and "Error" not in done.stderr, done.stderr


def test_a_group_word_lists_its_commands(capsys):
    assert main(["bench", "--help"]) == 0
    listed = [line.split()[:2] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert listed and all(words[0] == "bench" for words in listed) and ["bench", "offline"] in listed
    assert main(["bench", "nope"]) == 2
    assert capsys.readouterr().err.strip() == "drive: error: unknown command 'bench nope' (drive --help lists them)"


def test_a_missing_folder_and_a_folder_that_is_not_a_dataset(tmp_path, capsys):
    missing, empty = tmp_path / "nope", tmp_path / "empty"
    empty.mkdir()
    assert main(["data", "info", str(missing)]) == 2
    assert _one_line_error(capsys, "data info") == f"drive data info: error: {missing}: no such folder"
    for argv, command in ((["data", "info", str(empty)], "data info"),
                          (["train", "--controller", "gmle", "--data", str(empty), "--out", str(tmp_path / "r")],
                           "train")):  # fmt: skip
        assert main(argv) == 2
        says = f"{empty}: holds no manifest.json, so it is not a recorded dataset (drive collect --out DIR records one)"
        assert _one_line_error(capsys, command) == f"drive {command}: error: {says}"
    assert not (tmp_path / "r").exists()


def test_a_system_error_reads_as_a_sentence(tmp_path, capsys):
    from drive.errors import one_line

    missing = tmp_path / "no log.csv"
    assert main(["udacity", "standin", "--replay", str(missing)]) == 2
    assert _one_line_error(capsys, "udacity standin").endswith(f"error: {missing}: no such file or directory")
    assert one_line(FileNotFoundError(2, "No such file or directory", "x")) == "x: no such file or directory"
    assert one_line(OSError(98, "Address already in use")) == "address already in use"
    assert one_line(OSError(5, "I/O error")) == "I/O error"  # an acronym keeps its case
    assert one_line(OSError("a message of our own")) == "a message of our own"


@pytest.mark.parametrize(
    "argv, says",
    [
        (["trian"], "unknown command 'trian' (did you mean 'train'? drive --help lists them)"),
        (["trian", "--epochs", "3"], "unknown command 'trian' (did you mean 'train'? drive --help lists them)"),
        (["bench", "scael"], "unknown command 'bench scael' (did you mean 'bench scale'? drive --help lists them)"),
        (["bnech", "scale"], "unknown command 'bnech scale' (did you mean 'bench scale'? drive --help lists them)"),
        (["fallback", "calibrat"], "unknown command 'fallback calibrat' (did you mean 'fallback calibrate'? "
         "drive --help lists them)"),
        (["xyzzy"], "unknown command 'xyzzy' (drive --help lists them)"),
    ],
)  # fmt: skip
def test_a_mistyped_command_is_told_the_closest_one(argv, says, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"drive: error: {says}"
