"""A trainer that knows nothing about its task: two datasets of (x, y) pairs, a controller, a run directory.

    fit(model, train, val, cfg, run_dir, info) -> FitResult

AdamW with gradient clipping and a per-step cosine learning-rate schedule (or constant); target standardisation
fitted on the training targets (`Controller.set_target_stats`); validation NLL of the predictive Gaussian (mean,
aleatoric + epistemic variance) and MSE of its mean each epoch; best.pt and early stopping follow one of them
(`select`: val_nll by default; the demonstrations task picks val_mse, see drive/learn/tasks/demos.py).
The run directory receives
    config.json      trainer config, controller name and config, data fingerprint
    metrics.jsonl    one line per epoch (train loss, val nll/mse, lr, seconds)
    tb/              TensorBoard scalars
    best.pt, last.pt controller checkpoints (drive.checkpoint format, kind "controller")
    resume.pt        optimizer, epoch, RNG states, best score, early-stopping counter, written atomically after each
                     epoch, so `resume=True` after a kill continues exactly where the last finished epoch left off.
The compute a fit took (FitResult): `gradient_steps`, the optimizer steps taken (one per training batch: the
schedule's step count, which resume.pt carries), and `cpu_seconds`, this process's CPU time (every thread) over its
epochs, training and validation, summed over the sessions of a resumed run (resume.pt carries the sum; DataLoader
worker processes are not counted: num_workers=0 by default).
Exactness: batch order comes from a generator seeded by (seed, epoch), datasets with `set_epoch` are re-seeded the
same way, and the global torch/numpy/python RNG states (the model's own sampling) are restored from resume.pt.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from tqdm.auto import tqdm

from datasets.files import atomic_write
from drive import checkpoint, metrics
from drive.errors import UserError
from drive.learn import distributed, rng
from drive.learn.batches import epoch_generator, fit_target_stats, iterate_batches, n_batches, predict_dataset
from drive.learn.options import SELECT, TrainerConfig  # noqa: F401 - SELECT, TrainerConfig: imported from here too

log = logging.getLogger(__name__)


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
    best_val_nll: float  # of the kept epoch (best.pt), whichever score selected it
    epochs_run: int
    stopped_early: bool
    history: list[dict[str, float]]
    best_path: Path
    last_path: Path
    gradient_steps: int = 0  # optimizer steps taken over the whole run (resumed sessions included)
    cpu_seconds: float = 0.0  # process CPU time of the run's epochs (training and validation), summed over sessions


# -- the loop ----------------------------------------------------------------------------------------------------------
@dataclass
class _State:
    """What the loop carries from epoch to epoch (and resume.pt holds)."""

    start: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    best: float = math.inf
    best_epoch: int = 0
    bad_epochs: int = 0
    stopped: bool = False
    cpu_seconds: float = 0.0  # CPU time of the finished epochs (a resume.pt written before it counted: from there on)


def _resume(run_dir: Path, model, optimizer, scheduler, cfg: TrainerConfig) -> _State:
    path = run_dir / "resume.pt"
    if not path.is_file():
        raise UserError(f"{path}: nothing to resume (no resume file in the run directory)")
    checkpoint.verify(path)
    try:
        state = torch.load(path, map_location=cfg.device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    except Exception as exc:
        raise checkpoint.CheckpointError(f"{path}: cannot resume ({type(exc).__name__}: {exc})") from exc
    own = distributed.own_state(state.get("rng_ranks"), state["rng"])  # under torchrun each rank resumes its own
    if own is not None:
        rng.set_state(own)
    else:
        rng.seed_everything(cfg.seed + distributed.seed_offset() + state["epoch"])
    loop = _State(
        state["epoch"],
        list(state["history"]),
        state["best"],
        state["best_epoch"],
        state["bad_epochs"],
        state["stopped"],
        float(state.get("cpu_seconds", 0.0)),
    )
    if distributed.is_main():
        rng.truncate_log(run_dir / "metrics.jsonl", loop.start)
    if distributed.is_main():
        print(
            f"{run_dir}: resuming at epoch {loop.start + 1} of {cfg.epochs} ({loop.start} finished; best "
            f"{cfg.select} {loop.best:.5g} at epoch {loop.best_epoch})",
            flush=True,
        )
    return loop


def _start(run_dir: Path, model, train, cfg: TrainerConfig, info: CheckpointInfo) -> _State:
    if (run_dir / "resume.pt").exists():
        raise UserError(
            f"{run_dir} already holds a run: continue it with --resume (`drive train` does when its "
            "command is rerun), or use another --out"
        )
    rng.seed_everything(cfg.seed + distributed.seed_offset())
    loc, scale = fit_target_stats(train)
    model.set_target_stats(loc, scale)
    if not distributed.is_main():  # under torchrun rank 0 alone writes the run directory
        return _State()
    (run_dir / "metrics.jsonl").write_text("")
    config = {
        "trainer": dataclasses.asdict(cfg),
        "controller": info.name,
        "controller_config": info.config,
        "data": info.data,
        "target_names": list(info.target_names),
        **info.extra,
    }
    atomic_write(run_dir / "config.json", json.dumps(config, indent=2, default=str).encode())
    return _State()


def fit(model, train, val, cfg: TrainerConfig, run_dir: str | os.PathLike, info: CheckpointInfo) -> FitResult:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    best_path, last_path = run_dir / "best.pt", run_dir / "last.pt"
    model.to(cfg.device)
    n_train = len(train.tensors[1]) if getattr(train, "tensors", None) is not None else len(train)
    optimizer = model.configure_optimizer(cfg.lr, cfg.weight_decay, n_train)
    scheduler = _scheduler(optimizer, cfg, n_batches(train, cfg.batch_size))
    if cfg.resume and (run_dir / "resume.pt").is_file():
        loop = _resume(run_dir, model, optimizer, scheduler, cfg)
    else:  # a new run, or one killed before its first epoch finished: that one starts again from nothing
        if cfg.resume:
            log.warning("%s: no finished epoch to resume from; starting the run from the beginning", run_dir)
        loop = _start(run_dir, model, train, cfg, info)
    writer = _writer(run_dir, cfg, loop.start) if distributed.is_main() else None
    try:
        with distributed.data_parallel(model, cfg.device):
            for epoch in range(loop.start + 1, cfg.epochs + 1):
                if loop.stopped:
                    break
                _epoch(model, train, val, optimizer, scheduler, cfg, epoch, loop, run_dir, info, writer)
    finally:
        if writer is not None:
            writer.close()
    if distributed.is_main():  # the other ranks wrote no checkpoint (and on another node may not see rank 0's)
        if not best_path.is_file():
            raise RuntimeError(f"{run_dir}: no epoch finished, no checkpoint written (epochs={cfg.epochs})")
        model.load_state_dict(checkpoint.read(best_path, kind="controller")["state_dict"])
    best_nll = next((r["val_nll"] for r in loop.history if r["epoch"] == loop.best_epoch), math.inf)
    return FitResult(
        loop.best_epoch,
        best_nll,
        len(loop.history),
        loop.stopped,
        loop.history,
        best_path,
        last_path,
        int(scheduler.last_epoch),
        loop.cpu_seconds,
    )


def _epoch(
    model,
    train,
    val,
    optimizer,
    scheduler,
    cfg: TrainerConfig,
    epoch: int,
    loop: _State,
    run_dir: Path,
    info: CheckpointInfo,
    writer,
) -> None:
    """One epoch: train, validate, checkpoint (last, best), log, and the atomic resume state."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    train_loss = _train_epoch(model, train, optimizer, scheduler, cfg, epoch)
    model.on_epoch_end(epoch, cfg.epochs)
    rngs = distributed.gather(rng.get_state())  # every rank's RNG on rank 0, for an exact resume
    if not distributed.is_main():  # rank 0 validates, checkpoints and logs; it says whether early stopping ended it
        loop.stopped = distributed.from_main(None)
        return
    pred, y = predict_dataset(model, val, cfg.batch_size, cfg.val_samples or None, cfg.seed, cfg.device)
    # rank 0's stream as its next epoch starts: validation may draw from the global RNG too (NSAC's frame controller
    # does), and a resumed run must continue from the state an uninterrupted one trains the next epoch with
    rngs = [rng.get_state(), *rngs[1:]]
    val_nll, val_mse = metrics.gaussian_nll(pred.mean, pred.total_var, y), metrics.mse(pred.mean, y)
    row = {
        "epoch": epoch,
        "train_loss": train_loss,
        "val_nll": val_nll,
        "val_mse": val_mse,
        "lr": optimizer.param_groups[0]["lr"],
        "seconds": time.perf_counter() - t0,
    }
    loop.history.append(row)
    improved = row[cfg.select] < loop.best
    if improved:
        loop.best, loop.best_epoch, loop.bad_epochs = row[cfg.select], epoch, 0
    else:
        loop.bad_epochs += 1
    loop.stopped = cfg.patience > 0 and loop.bad_epochs >= cfg.patience
    _save_checkpoint(run_dir / "last.pt", model, info, row)
    if improved:
        _save_checkpoint(run_dir / "best.pt", model, info, row)
    with (run_dir / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps(row) + "\n")
    if writer is not None:
        for key in ("train_loss", "val_nll", "val_mse", "lr"):
            writer.add_scalar(key.replace("_", "/", 1), row[key], epoch)
        writer.flush()
    loop.cpu_seconds += time.process_time() - cpu0  # training, validation and the checkpoints of this epoch
    resume_state = {
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rngs[0],
        "rng_ranks": rngs,
        "history": loop.history,
        "best": loop.best,
        "best_epoch": loop.best_epoch,
        "bad_epochs": loop.bad_epochs,
        "stopped": loop.stopped,
        "cpu_seconds": loop.cpu_seconds,
    }
    checkpoint.atomic_torch_save(resume_state, run_dir / "resume.pt")
    log.info(
        "epoch %d/%d  loss %.4f  val nll %.4f  val mse %.5f%s",
        epoch,
        cfg.epochs,
        train_loss,
        val_nll,
        val_mse,
        "  *" if improved else "",
    )
    if loop.stopped:
        log.info("early stop: no better %s for %d epochs", cfg.select, cfg.patience)
    distributed.from_main(loop.stopped)


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
    batches = iterate_batches(
        train, cfg.batch_size, True, epoch_generator(cfg.seed, epoch), cfg.num_workers, distributed.batch_part()
    )
    bar = tqdm(
        batches,
        total=n_batches(train, cfg.batch_size),
        desc=f"epoch {epoch}/{cfg.epochs}",
        leave=False,
        disable=not cfg.progress,
        dynamic_ncols=True,
    )
    for step, (x, y) in enumerate(bar):
        x, y = x.to(cfg.device), y.to(cfg.device).float()
        try:
            loss = model.training_step(x, y, optimizer, cfg.grad_clip)
        except FloatingPointError as exc:
            raise FloatingPointError(f"{exc} at epoch {epoch}, step {step}") from None
        scheduler.step()
        total += loss.item() * len(y)
        count += len(y)
        bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
    total, n = distributed.sum_over_ranks(total, count)
    if n == 0:
        raise ValueError("the training dataset is empty")
    return total / n


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
        },
        data=info.data,
        # the epoch's scores, not its wall time (metrics.jsonl keeps that): the same run writes the same bytes
        metrics={k: float(v) for k, v in row.items() if k != "seconds"},
        extra={**info.extra, "epoch": int(row["epoch"])},
    )


def _writer(run_dir: Path, cfg: TrainerConfig, start: int):
    if not cfg.tensorboard:
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(run_dir / "tb"), purge_step=start + 1 if start else None)
