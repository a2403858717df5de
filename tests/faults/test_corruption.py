"""Flipped or truncated bytes in every file the project reads are refused with a one-line message naming the file."""

from __future__ import annotations

import random
import shutil

import numpy as np
import pytest
import torch

from agents.encoders import EncoderConfig
from agents.gmle import GMLEConfig
from agents.registry import config_to_dict
from datasets.bearings.raw import BearingFileError, read_xjtu
from datasets.demonstrations import Demonstrations
from datasets.errors import DataError
from datasets.udacity import read_log
from drive import checkpoint
from drive.cli import main
from drive.errors import UserError
from drive.observe.trace import read_trace
from tests.conftest import REPO

N_EACH = 6  # corruptions per file kind (seeded)


def _corrupt(path, rng: random.Random, kind: str) -> None:
    data = bytearray(path.read_bytes())
    if kind == "truncate":
        cut = rng.randrange(0, max(len(data) - 1, 1))
        path.write_bytes(bytes(data[:cut]))
    else:  # flip a few bytes
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data))
            data[i] ^= rng.randrange(1, 256)
        path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("faults") / "d"
    assert main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-2", "--max-episode-steps",
                 "30", "--min-return", "-1000", "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    return out


def _refused(tally, path, fn) -> None:
    tally["corruptions"] += 1
    try:
        fn()
    except (UserError, DataError, BearingFileError) as exc:
        message = str(exc)
        assert "\n" not in message and path.name in message, message
        return
    tally["accepted_corrupt_files"] += 1
    raise AssertionError(f"{path}: a corrupt file was accepted")


@pytest.mark.parametrize("target", ["episode", "manifest"])
def test_corrupt_dataset_files(dataset, tmp_path, tally, target):
    rng = random.Random(f"dataset-{target}")
    for k in range(N_EACH):
        copy = shutil.copytree(dataset, tmp_path / f"c{k}")
        path = copy / ("episodes/seed_000001.npz" if target == "episode" else "manifest.json")
        _corrupt(path, rng, "truncate" if k % 2 else "flip")
        _refused(tally, path, lambda copy=copy: [len(ep) for ep in Demonstrations(copy, include_flagged=True)])


def _small_checkpoint(path):
    cfg = GMLEConfig(encoder=EncoderConfig(kind="features", in_dim=3, d_model=8), out_dim=1, n_heads=2)
    return checkpoint.save(path, kind="controller", name="gmle", config=config_to_dict(cfg), module=cfg.build())


def test_corrupt_checkpoints(tmp_path, tally):
    rng = random.Random("checkpoint")
    good = _small_checkpoint(tmp_path / "good.pt")
    for k in range(N_EACH):
        path = tmp_path / f"bad{k}.pt"
        shutil.copy(good, path)
        _corrupt(path, rng, "truncate" if k % 2 else "flip")
        _refused(tally, path, lambda path=path: checkpoint.load_controller(path))


def test_a_changed_byte_anywhere_in_a_checkpoint_is_refused(tmp_path, tally):
    """The zip CRCs cover members' bytes only; headers, names and torch's alignment padding were unchecked (a flip
    there loaded as the original). The seal covers every byte: sweep one flip over each."""
    good = _small_checkpoint(tmp_path / "good.pt")
    data = good.read_bytes()
    path = tmp_path / "bad.pt"
    for i in range(0, len(data), 7):
        flipped = bytearray(data)
        flipped[i] ^= 0x20
        path.write_bytes(bytes(flipped))
        _refused(tally, path, lambda: checkpoint.load_controller(path))


def test_the_seal_does_not_depend_on_the_file_name_and_torch_still_reads_it(tmp_path):
    a, b = tmp_path / "a.pt", tmp_path / "elsewhere" / "b.pt"
    torch.manual_seed(0)
    _small_checkpoint(a)
    torch.manual_seed(0)
    _small_checkpoint(b)
    assert a.read_bytes() == b.read_bytes()  # the archive is built in memory: no temp name, no PID inside
    assert a.read_bytes()[-77:-64] == b"drive-sha256:"
    assert torch.load(a, weights_only=True)["name"] == "gmle"
    assert checkpoint.check_seal(a) is True


def test_a_flip_inside_a_tensor_of_an_unsealed_file_fails_its_crc(tmp_path, tally):
    """Files written before seals carry none: the zip CRC check still refuses a flip in a tensor's bytes, which
    torch.load alone would load as other weights."""
    import zipfile

    cfg = GMLEConfig(encoder=EncoderConfig(kind="features", in_dim=3, d_model=8), out_dim=1, n_heads=2)
    path = tmp_path / "c.pt"
    torch.save(torch.load(_small_checkpoint(tmp_path / "s.pt"), weights_only=True), path)  # as before seals
    assert checkpoint.check_seal(path) is False and checkpoint.load_controller(path)[1]["config"] == config_to_dict(cfg)
    with zipfile.ZipFile(path) as archive:
        big = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
        start = big.header_offset + 30 + len(big.filename.encode()) + len(big.extra)  # local header + name + extra
    data = bytearray(path.read_bytes())
    data[start + big.file_size // 2] ^= 0x40
    path.write_bytes(bytes(data))
    assert torch.load(path, weights_only=True)["name"] == "gmle"  # torch alone would have loaded it
    tally["corruptions"] += 1
    with pytest.raises(checkpoint.CheckpointError, match="fails its CRC check"):
        checkpoint.load_controller(path)


def test_corrupt_parquet_traces(tmp_path, tally):
    from drive.observe.trace import write_trace

    rng = random.Random("trace")
    rows = [{"t": t, "mean_steer": 0.1 * t, "action_steer": 0.0, "x": float(t)} for t in range(50)]
    good = write_trace(tmp_path / "good.parquet", rows, {"seed": 0})
    for k in range(N_EACH):
        path = tmp_path / f"bad{k}.parquet"
        shutil.copy(good, path)
        _corrupt(path, rng, "truncate" if k % 2 == 0 else "flip")
        tally["corruptions"] += 1
        try:
            table, _ = read_trace(path)
            values = table.column("mean_steer").to_pylist()
        except UserError as exc:
            assert "\n" not in str(exc) and path.name in str(exc)
            continue
        except OSError as exc:  # pyarrow found the damage while decoding a page
            assert path.name in str(exc) or "parquet" in str(exc).lower()
            continue
        if values == [r["mean_steer"] for r in rows]:  # a flip in padding or statistics: harmless
            continue
        tally["accepted_corrupt_files"] += 1
        raise AssertionError(f"{path}: altered values read without an error")


def test_corrupt_driving_logs(tmp_path, tally):
    rng = random.Random("udacity")
    fixture = REPO / "tests" / "fixtures" / "udacity"
    for k in range(N_EACH):
        copy = shutil.copytree(fixture, tmp_path / f"u{k}")
        path = copy / "driving_log.csv"
        text = path.read_text().splitlines()
        row = rng.randrange(len(text))
        fields = text[row].split(",")
        fields[rng.randrange(3, len(fields))] = rng.choice(["nan", "x", "", "1e999", "7"])  # a bad number
        text[row] = ",".join(fields)
        path.write_text("\n".join(text) + "\n")
        _refused(tally, path, lambda copy=copy: read_log(copy))


def test_corrupt_raw_bearing_files(tmp_path, tally):
    rng = random.Random("bearing")
    src = REPO / "tests" / "fixtures" / "bearings" / "xjtu" / "35Hz12kN" / "Bearing1_1" / "1.csv"
    for k in range(N_EACH):
        path = tmp_path / f"{k + 1}.csv"
        lines = src.read_text().splitlines()
        i = rng.randrange(1, len(lines))
        lines[i] = rng.choice(["", "1.0", "a,b", "nan,0.1", "0.1;0.2;0.3"])
        path.write_text("\n".join(lines[: len(lines) - (k % 2) * 5]) + "\n")
        expected = None if k % 2 else len(lines) - 1
        _refused(tally, path, lambda path=path, expected=expected: read_xjtu(path, expected))
    assert np.isfinite(read_xjtu(src, None)).all()  # the pristine file still reads
