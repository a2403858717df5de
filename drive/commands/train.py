"""`drive train`: train a controller (NSAC or a baseline) on a task and write RUNDIR/metrics.json.

    drive train --controller gmle --out runs/spiral-gmle                    # the irregular spiral (default task)
    drive train --controller nsac --data runs/demos --out runs/bc-nsac      # recorded CarRacing demonstrations
    drive train --controller de --data udacity:../shared/data/udacity_sim --out runs/udacity-de
    drive train --task spiral --controller nsac --out runs/spiral-nsac --set task.train_region=interpolation
    drive train ... --resume                                                # continue an interrupted run exactly
    drive train ... --set n_heads=2 encoder.d_model=32 task.n_freqs=4 trainer.patience=5
    torchrun --nproc_per_node 2 -m drive train ...                          # data-parallel (DDP), same options

What runs is drive/learn/experiment.py; the task options are listed at the end of `drive train --help`. Under
torchrun (drive/learn/distributed.py) `--batch-size` is the global batch; rank 0 alone prints, checkpoints,
evaluates and writes metrics.json, the other ranks only train their part of each batch.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from drive.learn import distributed, tasks
from drive.learn.experiment import TrainRequest, prepare, summary, train_and_evaluate
from drive.learn.trainer import CheckpointInfo, fit
from drive.options import NonNegativeInt, PositiveFloat, PositiveInt


@dataclass(frozen=True)
class Config:
    controller: str
    """controller to train: nsac, gmle, mcd, de, der, sdenet (agents/registry.py lists every one)"""
    out: Path
    """run directory (config, metrics log, TensorBoard, checkpoints, metrics.json)"""
    task: str | None = None
    """task plugin: spiral, demos, udacity, ... (default: inferred from --data, spiral without it)"""
    data: str | None = None
    """DIR: recorded demonstrations (task demos); udacity:DIR: a Udacity simulator log; or the task's data root"""
    epochs: PositiveInt | None = None
    """maximum epochs (default: the task's)"""
    batch_size: PositiveInt | None = None
    """minibatch size (default: the task's)"""
    lr: PositiveFloat | None = None
    """learning rate (default: the task's)"""
    seed: NonNegativeInt = 0
    """seed for the split, initialisation, batch order and sampling"""
    resume: bool = False
    """continue the interrupted run in --out exactly where its last finished epoch left off"""
    resume_with_changes: bool = False
    """with --resume: accept settings that differ from the run's (data, options, controller), recorded in config.json"""
    set: tuple[str, ...] = ()
    """KEY=VALUE overrides: controller fields (n_heads=2, encoder.d_model=32), task.KEY, trainer.KEY"""
    device: str = "cpu"
    """torch device"""
    progress: bool = True
    """show progress bars"""
    threads: NonNegativeInt = 0
    """torch intra-op CPU threads (0: auto, half the CPUs this process may use, at least 1 — on a 2-core machine
    torch's default of 2 trained an NSAC epoch in 18.8 s, one thread in 10.9 s: the other core feeds the batches)"""


def auto_threads() -> int:
    """Half the CPUs available to this process (its affinity mask), at least one."""
    return max(1, len(os.sched_getaffinity(0)) // 2)


def epilog() -> str:
    return tasks.help_text()


def run(cfg: Config) -> int:
    torch.set_num_threads(cfg.threads or auto_threads())
    argv = sys.argv[2:] if sys.argv[1:2] == ["train"] else []
    with distributed.session(cfg.device) as device:
        world = {"world_size": distributed.world_size()} if distributed.active() else {}
        request = TrainRequest(controller=cfg.controller, out=cfg.out, task=cfg.task, data=cfg.data,
                               epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed,
                               resume=cfg.resume, resume_with_changes=cfg.resume_with_changes, overrides=cfg.set,
                               device=device,
                               progress=cfg.progress and distributed.is_main(), extra=world,
                               command="drive train " + " ".join(argv) if argv else "drive train")  # fmt: skip
        if not distributed.is_main():
            _follow(request)
            return 0
        report = train_and_evaluate(request)
    print(summary(report))
    print(f"wrote {Path(cfg.out) / 'metrics.json'}")
    return 0


def _follow(req: TrainRequest) -> None:
    """A rank other than 0 under torchrun: the same data and model, trained on its part of each batch (the trainer
    keeps it in step with rank 0, which writes everything)."""
    data, model_cfg, train_cfg = prepare(req)
    torch.manual_seed(req.seed)
    fit(model_cfg.build(), data.train, data.val, train_cfg, req.out, CheckpointInfo(req.controller, {}))
