"""`torchrun --nproc_per_node 2 -m drive train` on gloo: trains, rank 0 alone writes, resumes, matches one process."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from drive.cli import main
from drive.learn import distributed
from drive.learn.batches import epoch_generator, iterate_batches
from tests.conftest import REPO

# constant LR: a run of 2 epochs resumed to 3 is the 3-epoch run (a cosine schedule depends on the epoch count)
ARGS = ["--controller", "gmle", "--batch-size", "64", "--seed", "3", "--threads", "1", "--no-progress",
        "--set", "trainer.schedule=constant", "task.n_obs=10", "trainer.tensorboard=false"]  # fmt: skip


def torchrun(out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "drive", "train", "--out", str(out), *ARGS, *extra]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def curve(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_two_gloo_ranks_train_write_once_resume_and_match_one_process(tmp_path, one_thread):
    assert main(["train", "--out", str(tmp_path / "one"), *ARGS, "--epochs", "3"]) == 0
    single = curve(tmp_path / "one")

    first = torchrun(tmp_path / "ddp", "--epochs", "2")
    assert first.stdout.count("training gmle") == 1 and first.stdout.count("wrote ") == 1  # rank 0 alone prints
    assert [r["epoch"] for r in curve(tmp_path / "ddp")] == [1, 2]  # one log line per epoch: one writer
    state = torch.load(tmp_path / "ddp" / "resume.pt", weights_only=True)
    assert state["epoch"] == 2 and len(state["rng_ranks"]) == 2  # each rank's RNG kept for the resume
    assert sorted(p.name for p in (tmp_path / "ddp").iterdir() if p.suffix == ".pt") == ["best.pt", "last.pt",
                                                                                          "resume.pt"]  # fmt: skip
    torchrun(tmp_path / "ddp", "--epochs", "3", "--resume")
    ddp = curve(tmp_path / "ddp")
    assert [r["epoch"] for r in ddp] == [1, 2, 3]
    # the same global batches, the gradients averaged over the two halves: the single-process curve up to float
    # summation order (and the unequal halves of an odd last batch)
    for a, b in zip(single, ddp, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-3, abs=1e-3), (single, ddp)
        assert b["val_nll"] == pytest.approx(a["val_nll"], rel=1e-3, abs=1e-3), (single, ddp)
    report = json.loads((tmp_path / "ddp" / "metrics.json").read_text())
    assert report["fit"]["epochs_run"] == 3
    assert json.loads((tmp_path / "ddp" / "config.json").read_text())["world_size"] == 2


def _rank_in_session(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks: rank 0 works a second longer inside the session (as it evaluates and writes after the
    last epoch); each writes when its work ended and when it left the session."""
    os.environ.update(WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip
    with distributed.session("cpu"):
        time.sleep(1.0 if rank == 0 else 0.0)
        worked = time.monotonic()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"worked": worked, "left": time.monotonic()}))


def test_no_rank_leaves_the_session_before_rank_0_has_finished(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank_in_session, args=(r, port, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r1["worked"] < r0["worked"] <= r1["left"]  # rank 1 waited for rank 0 before tearing the group down


class Items(torch.utils.data.Dataset):
    """A dataset without the `tensors` fast path: batches come from a DataLoader."""

    def __init__(self, n: int):
        self.x, self.y = torch.arange(n * 2.0).reshape(n, 2), torch.arange(float(n))[:, None]

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


@pytest.mark.parametrize("fast_path", [True, False])
def test_rank_parts_of_each_batch_are_the_single_process_batch(fast_path):
    data = Items(23)
    if fast_path:
        data.tensors = (data.x, data.y)  # type: ignore[attr-defined]
    single = list(iterate_batches(data, 8, True, epoch_generator(5, 2)))
    parts = [list(iterate_batches(data, 8, True, epoch_generator(5, 2), 0, lambda idx, r=r: idx.tensor_split(2)[r]))
             for r in range(2)]  # fmt: skip
    assert len(single) == len(parts[0]) == len(parts[1]) == 3
    for (x, y), (x0, y0), (x1, y1) in zip(single, *parts, strict=True):
        assert torch.equal(torch.cat([x0, x1]), x) and torch.equal(torch.cat([y0, y1]), y)
