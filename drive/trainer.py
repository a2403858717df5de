"""A trainer that knows nothing about its task: two datasets of (x, y) pairs, a controller, a run directory.

    fit(model, train, val, cfg, run_dir, info) -> FitResult

AdamW with gradient clipping and a per-step cosine learning-rate schedule (or constant); target standardisation
fitted on the training targets (`Controller.set_target_stats`); validation NLL of the predictive Gaussian (mean,
aleatoric + epistemic variance) each epoch, early stopping on it.
The run directory receives
    config.json      trainer config, controller name and config, data fingerprint
    metrics.jsonl    one line per epoch (train loss, val nll/mse, lr, seconds)
    tb/              TensorBoard scalars
    best.pt, last.pt controller checkpoints (drive.checkpoint format, kind "controller")
    resume.pt        optimizer, epoch, RNG states, best score, early-stopping counter, written atomically after each
                     epoch, so `resume=True` after a kill continues exactly where the last finished epoch left off.
Exactness: batch order comes from a generator seeded by (seed, epoch), datasets with `set_epoch` are re-seeded the
same way, and the global torch/numpy/python RNG states (the model's own sampling) are restored from resume.pt.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from tqdm.auto import tqdm

from agents.base import Prediction
from drive import checkpoint, metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainerConfig:
    epochs: int = 20
    """maximum number of epochs"""
    batch_size: int = 128
    """minibatch size"""
    lr: float = 1e-3
    """AdamW learning rate"""
    weight_decay: float = 1e-4
    """AdamW weight decay"""
    schedule: str = "cosine"
    """learning-rate schedule: cosine (anneal to 0 over `epochs`, per step) or constant"""
    grad_clip: float = 1.0
    """clip the global gradient norm to this value (0 disables)"""
    patience: int = 10
    """stop after this many epochs without a better validation NLL (0 disables early stopping)"""
    seed: int = 0
    """seed for batch order, the model's sampling and validation draws"""
    val_samples: int = 0
    """stochastic samples per validation prediction (0: the controller's default)"""
    device: str = "cpu"
    """torch device (cpu, cuda)"""
    num_workers: int = 0
    """DataLoader worker processes for datasets without a `tensors` fast path"""
    resume: bool = False
    """continue from run_dir/resume.pt"""
    progress: bool = True
    """show a progress bar"""
    tensorboard: bool = True
    """write TensorBoard scalars to run_dir/tb"""


@dataclass(frozen=True)
class CheckpointInfo:
    """What the trainer writes into checkpoints besides the weights (it does not know where they came from)."""

    name: str
    """registry name of the controller"""
    config: dict[str, Any]
    """agents.registry.config_to_dict(controller config)"""
    data: dict[str, Any] = field(default_factory=dict)
    target_names: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


class FitResult(NamedTuple):
    best_epoch: int
    best_val_nll: float
    epochs_run: int
    stopped_early: bool
    history: list[dict[str, float]]
    best_path: Path
    last_path: Path


# -- data helpers ------------------------------------------------------------------------------------------------------
def _epoch_generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


def iterate_batches(dataset, batch_size: int, shuffle: bool, generator=None, num_workers: int = 0):
    """Yield (x, y) batches; slices `dataset.tensors` directly when the dataset offers it."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        x, y = tensors
        n = len(y)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            yield x[idx], y[idx]
        return
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=shuffle, generator=generator, num_workers=num_workers
    )
    yield from loader


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
    model, dataset, batch_size: int = 512, n_samples: int | None = None, seed: int = 0, device: str = "cpu"
) -> tuple[Prediction, torch.Tensor]:
    """The model's Prediction over a whole dataset (in order) and the targets, both on the CPU."""
    model.eval()
    generator = torch.Generator(device=device).manual_seed(seed)
    parts, ys = [], []
    for x, y in iterate_batches(dataset, batch_size, shuffle=False):
        pred = model.predict(x.to(device), n_samples or None, generator)
        parts.append(Prediction(*(t.cpu() for t in pred)))
        ys.append(y.float())
    return Prediction(*(torch.cat(ts) for ts in zip(*parts, strict=True))), torch.cat(ys)


# -- resume state ------------------------------------------------------------------------------------------------------
def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "python": random.getstate(),
    }  # fmt: skip


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


# -- the loop ----------------------------------------------------------------------------------------------------------
def fit(model, train, val, cfg: TrainerConfig, run_dir: str | os.PathLike, info: CheckpointInfo) -> FitResult:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    resume_path, best_path, last_path = run_dir / "resume.pt", run_dir / "best.pt", run_dir / "last.pt"
    log_path = run_dir / "metrics.jsonl"
    model.to(cfg.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = _scheduler(optimizer, cfg, n_batches(train, cfg.batch_size))

    if cfg.resume:
        if not resume_path.is_file():
            raise FileNotFoundError(f"{resume_path}: nothing to resume (no resume file in the run directory)")
        try:
            state = torch.load(resume_path, map_location=cfg.device, weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
        except Exception as exc:
            raise checkpoint.CheckpointError(f"{resume_path}: cannot resume ({type(exc).__name__}: {exc})") from exc
        _set_rng_state(state["rng"])
        start, history = state["epoch"], list(state["history"])
        best, best_epoch = state["best"], state["best_epoch"]
        bad_epochs, stopped = state["bad_epochs"], state["stopped"]
        _truncate_log(log_path, start)
        log.info("resumed %s at epoch %d (best val nll %.4f at epoch %d)", run_dir, start, best, best_epoch)
    else:
        if resume_path.exists():
            raise FileExistsError(f"{run_dir} already holds a run: pass --resume to continue it, or another --out")
        _seed_everything(cfg.seed)
        loc, scale = fit_target_stats(train)
        model.set_target_stats(loc, scale)
        start, history, best, best_epoch, bad_epochs, stopped = 0, [], math.inf, 0, 0, False
        log_path.write_text("")
        config = {"trainer": dataclasses.asdict(cfg), "controller": info.name, "controller_config": info.config,
                  "data": info.data, "target_names": list(info.target_names), **info.extra}  # fmt: skip
        (run_dir / "config.json").write_text(json.dumps(config, indent=2, default=str))

    writer = _writer(run_dir, cfg, start)
    val_samples = cfg.val_samples or None
    try:
        for epoch in range(start + 1, cfg.epochs + 1):
            if stopped:
                break
            t0 = time.perf_counter()
            train_loss = _train_epoch(model, train, optimizer, scheduler, cfg, epoch)
            pred, y = predict_dataset(model, val, cfg.batch_size, val_samples, cfg.seed, cfg.device)
            val_nll, val_mse = metrics.gaussian_nll(pred.mean, pred.total_var, y), metrics.mse(pred.mean, y)
            row = {"epoch": epoch, "train_loss": train_loss, "val_nll": val_nll, "val_mse": val_mse,
                   "lr": optimizer.param_groups[0]["lr"], "seconds": time.perf_counter() - t0}  # fmt: skip
            history.append(row)
            improved = val_nll < best
            if improved:
                best, best_epoch, bad_epochs = val_nll, epoch, 0
            else:
                bad_epochs += 1
            stopped = cfg.patience > 0 and bad_epochs >= cfg.patience
            _save_checkpoint(last_path, model, info, row)
            if improved:
                _save_checkpoint(best_path, model, info, row)
            with log_path.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            if writer is not None:
                for key in ("train_loss", "val_nll", "val_mse", "lr"):
                    writer.add_scalar(key.replace("_", "/", 1), row[key], epoch)
                writer.flush()
            resume_state = {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict(), "rng": _rng_state(), "history": history,
                            "best": best, "best_epoch": best_epoch, "bad_epochs": bad_epochs,
                            "stopped": stopped}  # fmt: skip
            checkpoint.atomic_torch_save(resume_state, resume_path)
            log.info("epoch %d/%d  loss %.4f  val nll %.4f  val mse %.5f%s", epoch, cfg.epochs, train_loss, val_nll,
                     val_mse, "  *" if improved else "")  # fmt: skip
            if stopped:
                log.info("early stop: no better validation NLL for %d epochs", cfg.patience)
    finally:
        if writer is not None:
            writer.close()

    if not best_path.is_file():
        raise RuntimeError(f"{run_dir}: no epoch finished, no checkpoint written (epochs={cfg.epochs})")
    model.load_state_dict(checkpoint.read(best_path, kind="controller")["state_dict"])
    return FitResult(best_epoch, best, len(history), stopped, history, best_path, last_path)


def _scheduler(optimizer, cfg: TrainerConfig, steps_per_epoch: int):
    if cfg.schedule == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    if cfg.schedule == "cosine":
        total = max(1, cfg.epochs * steps_per_epoch)
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, total) / total))
        )
    raise ValueError(f"TrainerConfig.schedule must be cosine or constant, got {cfg.schedule!r}")


def _train_epoch(model, train, optimizer, scheduler, cfg: TrainerConfig, epoch: int) -> float:
    model.train()
    if hasattr(train, "set_epoch"):
        train.set_epoch(epoch)
    total, count = 0.0, 0
    batches = iterate_batches(train, cfg.batch_size, True, _epoch_generator(cfg.seed, epoch), cfg.num_workers)
    bar = tqdm(batches, total=n_batches(train, cfg.batch_size), desc=f"epoch {epoch}/{cfg.epochs}", leave=False,
               disable=not cfg.progress, dynamic_ncols=True)  # fmt: skip
    for step, (x, y) in enumerate(bar):
        x, y = x.to(cfg.device), y.to(cfg.device).float()
        loss = model.loss(x, y)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite training loss {loss.item()} at epoch {epoch}, step {step}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        total += loss.item() * len(y)
        count += len(y)
        bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
    if count == 0:
        raise ValueError("the training dataset is empty")
    return total / count


def _save_checkpoint(path: Path, model, info: CheckpointInfo, row: dict[str, float]) -> None:
    checkpoint.save(
        path,
        kind="controller",
        name=info.name,
        config=info.config,
        module=model,
        normalisation={
            "y_loc": model.y_loc.tolist(),
            "y_scale": model.y_scale.tolist(),
            "target_names": list(info.target_names),
        },  # fmt: skip
        data=info.data,
        metrics={k: float(v) for k, v in row.items()},
        extra={**info.extra, "epoch": int(row["epoch"])},
    )


def _truncate_log(path: Path, epoch: int) -> None:
    """Drop log lines of epochs after the resume point (written before a kill, then redone)."""
    if not path.is_file():
        return
    keep = [line for line in path.read_text().splitlines() if line and json.loads(line)["epoch"] <= epoch]
    path.write_text("".join(line + "\n" for line in keep))


def _writer(run_dir: Path, cfg: TrainerConfig, start: int):
    if not cfg.tensorboard:
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(run_dir / "tb"), purge_step=start + 1 if start else None)
