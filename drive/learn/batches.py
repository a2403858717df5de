"""Batches for the trainer and for evaluation: slices of a dataset's `tensors` when it offers them (no collation),
a DataLoader otherwise; the training-target statistics; a model's Prediction over a whole dataset."""

from __future__ import annotations

import math

import torch

from agents.base import Prediction


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


def iterate_batches(dataset, batch_size: int, shuffle: bool, generator=None, num_workers: int = 0, part=None):
    """Yield (x, y) batches; slices `dataset.tensors` directly when the dataset offers it. `part(idx)` (data-parallel
    training, drive/learn/distributed.py) maps each batch's indices to the ones this process trains on, or None to
    skip the batch; the batches are drawn in the order a single process draws them."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        x, y = tensors
        for idx in _index_batches(len(y), batch_size, shuffle, generator, part):
            yield x[idx], y[idx]
        return
    if part is not None:  # the DataLoader below draws its workers' base seed from `generator`, then the randperm
        base = torch.empty((), dtype=torch.int64).random_(generator=generator) if generator is not None else None
        sampler = [idx.tolist() for idx in _index_batches(len(dataset), batch_size, shuffle, generator, part)]
        seeded = torch.Generator().manual_seed(int(base)) if base is not None else None
        yield from torch.utils.data.DataLoader(
            dataset, batch_sampler=sampler, num_workers=num_workers, generator=seeded
        )
        return
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=shuffle, generator=generator, num_workers=num_workers
    )
    yield from loader


def _index_batches(n: int, batch_size: int, shuffle: bool, generator, part):
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        idx = part(idx) if part is not None else idx
        if idx is not None:
            yield idx


def n_batches(dataset, batch_size: int) -> int:
    tensors = getattr(dataset, "tensors", None)
    n = len(tensors[1]) if tensors is not None else len(dataset)
    return math.ceil(n / batch_size)


def fit_target_stats(dataset, batch_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-dimension mean and std of the training targets."""
    targets = getattr(dataset, "targets", None)
    if targets is None:
        targets = torch.cat([y for _, y in iterate_batches(dataset, batch_size, shuffle=False)])
    targets = torch.as_tensor(targets, dtype=torch.float64)
    if targets.ndim != 2 or len(targets) == 0:
        raise ValueError(f"training targets must be a non-empty (N, D) array, got shape {tuple(targets.shape)}")
    return targets.mean(0).float(), targets.std(0, unbiased=False).float()


@torch.no_grad()
def predict_dataset(
    model, dataset, batch_size: int = 512, samples: int | None = None, seed: int = 0, device: str = "cpu"
) -> tuple[Prediction, torch.Tensor]:
    """The model's Prediction over a whole dataset (in order) and the targets, both on the CPU."""
    model.eval()
    generator = torch.Generator(device=device).manual_seed(seed)
    parts, ys = [], []
    for x, y in iterate_batches(dataset, batch_size, shuffle=False):
        pred = model.predict(x.to(device), samples or None, generator)
        parts.append(Prediction(*(t.cpu() for t in pred)))
        ys.append(y.float())
    return Prediction(*(torch.cat(ts) for ts in zip(*parts, strict=True))), torch.cat(ys)


def take(dataset, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (x, y) of the samples `idx` as two batched tensors (sliced from `tensors` or stacked from items)."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        return tensors[0][idx], tensors[1][idx]
    if hasattr(dataset, "stacks") and hasattr(dataset, "targets"):  # frames stored once, stacks gathered by index
        return dataset.stacks(idx), dataset.targets[idx]
    items = [dataset[int(i)] for i in idx]
    return torch.stack([torch.as_tensor(x) for x, _ in items]), torch.stack([torch.as_tensor(y) for _, y in items])
