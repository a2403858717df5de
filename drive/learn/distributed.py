"""Data-parallel training under torchrun: the process group, the DDP wrapper, and what the ranks share.

    torchrun --nproc_per_node 2 -m drive train --controller nsac --data runs/demos --out runs/ddp   # one machine
    torchrun --nnodes 2 --node_rank R --rdzv_backend c10d --rdzv_endpoint HOST:29500 --nproc_per_node 1 \
        -m drive train ...                                                                         # two machines

The same `drive train` command line. torchrun's environment (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT) makes
`session` join the process group: gloo on the CPU, nccl when the device is CUDA (each rank on cuda:LOCAL_RANK).
Without it (WORLD_SIZE unset or 1) every function here is the single-process no-op, so the trainer has one code
path.

What each rank does (drive/learn/trainer.py): every rank loads the data and takes the same global permutation of
it per epoch (the generator is seeded by (seed, epoch)); each global batch of `--batch-size` is cut into WORLD_SIZE
contiguous parts and rank r trains on part r (`shard_of`), so `--batch-size` stays the global batch and, with
DDP averaging the gradients, an update is the single-process update (up to float summation order; a last global
batch smaller than WORLD_SIZE is dropped, and uneven parts of a last batch weigh their samples unequally). Rank 0
alone validates, writes checkpoints, metrics.jsonl, TensorBoard and resume.pt, and shows progress; the other ranks
only train, and learn from rank 0 whether early stopping ended the run. resume.pt keeps every rank's RNG state,
so `--resume` with the same number of ranks continues exactly (with another number, rank 0's state seeds rank 0
and the others draw fresh streams). On several machines the run directory must be on a filesystem all of them see.
Controllers whose own `training_step` draws weights per step (ft-ivon) are refused: their ranks would disagree.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from agents.base import Controller
from drive.devices import resolve
from drive.errors import UserError


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    return rank() == 0


@contextlib.contextmanager
def session(device: str) -> Iterator[str]:
    """Join torchrun's process group when its environment names more than one rank; yields this rank's device
    (checked with `drive.devices.resolve` first: a device this node lacks is one line, not a traceback)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or dist.is_initialized():
        yield str(resolve(device))
        return
    cuda = resolve(device).type == "cuda"
    if cuda:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    # a gloo group for leaving together (below): its own long timeout, since rank 0's evaluation after the last
    # epoch may outlast a collective's default timeout (gloo 30 min, nccl's watchdog 10)
    leave = dist.new_group(backend="gloo", timeout=datetime.timedelta(hours=24))
    finished = False
    try:
        yield device
        finished = True
    finally:
        # The ranks leave together: rank 0 evaluates and writes for seconds after the last epoch, and a rank that
        # tore its transport down and exited meanwhile was seen (once in CI, 2 gloo ranks) to abort at exit, which
        # made torchrun kill rank 0 before it wrote metrics.json. After an error no barrier: the peer may never come.
        if finished:
            dist.barrier(group=leave)
        dist.destroy_process_group()


def shard_of(idx: torch.Tensor) -> torch.Tensor | None:
    """This rank's contiguous part of one global batch of indices; None (on every rank alike) for a batch too small
    to give each rank a sample."""
    n = world_size()
    return None if len(idx) < n else torch.tensor_split(idx, n)[rank()]


def batch_part():
    """What `iterate_batches(part=...)` takes: `shard_of` under torchrun, None in a single process."""
    return shard_of if active() else None


def seed_offset() -> int:
    """Added to the trainer's seed so each rank draws its own sampling noise (0 in a single process)."""
    return 1_000_003 * rank()


def sum_over_ranks(*values: float) -> tuple[float, ...]:
    if not active():
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return tuple(t.tolist())


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj` on rank 0 (in rank order); [obj] elsewhere and in a single process."""
    if not active():
        return [obj]
    out: list[Any] | None = [None] * world_size() if is_main() else None
    dist.gather_object(obj, out, dst=0)
    return out if out is not None else [obj]


def from_main(obj: Any) -> Any:
    """Rank 0's `obj` on every rank."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def own_state(states: list[Any] | None, fallback: Any) -> Any:
    """This rank's entry of a per-rank list saved by a run with the same number of ranks, else `fallback` on rank 0
    and None (draw afresh) on the others."""
    if states is not None and len(states) == world_size():
        return states[rank()]
    return fallback if is_main() else None


class _LossOf(nn.Module):
    """The controller's training loss as a forward pass, so DDP sees (and synchronises) the backward of it."""

    def __init__(self, model: Controller):
        super().__init__()
        self.model = model
        self.loss = type(model).loss  # the class's method: the instance attribute set below routes here

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(self.model, x, y)


@contextlib.contextmanager
def data_parallel(model: Controller, device: str) -> Iterator[None]:
    """While training, `model.loss` runs through DistributedDataParallel (gradients averaged over the ranks at
    every backward); the controller's own `training_step` is used unchanged."""
    if not active():
        yield
        return
    if type(model).training_step is not Controller.training_step:
        raise UserError(f"{type(model).__name__} trains with its own per-step weight sampling: run it on one rank")
    ids = [torch.device(device).index] if device.startswith("cuda") else None
    # every registered controller's loss reaches all its parameters: no search for unused ones at each backward
    ddp = nn.parallel.DistributedDataParallel(_LossOf(model), device_ids=ids)
    # an instance attribute (a plain function: a Module value would become a submodule) shadows the class's loss,
    # so training_step's self.loss(x, y) is the DDP forward
    model.loss = lambda x, y: ddp(x, y)  # type: ignore[method-assign]
    try:
        yield
    finally:
        del model.loss
