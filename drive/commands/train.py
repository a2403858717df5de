"""`drive train`: train a controller (NSAC or a baseline) on a task and write RUNDIR/metrics.json.

    drive train --controller gmle --out runs/spiral-gmle                    # the irregular spiral (default task)
    drive train --controller nsac --data runs/demos --out runs/bc-nsac      # recorded CarRacing demonstrations
    drive train --controller de --data udacity:../shared/data/udacity_sim --out runs/udacity-de
    drive train --task spiral --controller nsac --out runs/spiral-nsac --set task.train_region=interpolation
    drive train ...                                                         # again: continues the run exactly
    drive train ... --set n_heads=2 encoder.d_model=32 task.n_freqs=4 trainer.patience=5
    torchrun --nproc_per_node 2 -m drive train ...                          # data-parallel (DDP), same options

What runs is drive/learn/experiment.py. Rerunning a command continues its run in --out exactly (a finished run says
so and prints its summary); another command on the same --out is refused, naming what differs. `drive train --help`
lists after the options every `--set` key: each task's options, each controller's fields and the trainer's keys,
read from their source (drive/fields.py): the help loads no torch, which `run` imports when a run starts. Under
torchrun (drive/learn/distributed.py) `--batch-size` is the global batch; rank 0 alone prints, checkpoints,
evaluates and writes metrics.json, the other ranks only train their part of each batch.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

from drive import fields
from drive.learn import tasks
from drive.options import NonNegativeInt, PositiveFloat, PositiveInt

RESUMES = True  # rerunning the same command continues what an interrupted run left

# tyro would add "(default: None)" after these options' own default
TASK_DEFAULT = tyro.conf.arg(help_behavior_hint="(default: the task's)")
INFERRED = tyro.conf.arg(help_behavior_hint="(default: inferred from --data, spiral without it)")


@dataclass(frozen=True)
class Config:
    controller: str
    """controller to train: nsac, gmle, mcd, de, der, sdenet, ... (every one and its fields below)"""
    out: Path
    """run directory (config, metrics log, TensorBoard, checkpoints, metrics.json); rerunning continues its run"""
    task: Annotated[str | None, INFERRED] = None
    """task plugin: spiral, demos, udacity, ... (every one and its options below)"""
    data: str | None = None
    """DIR: recorded demonstrations (task demos); udacity:DIR: a Udacity simulator log; or the task's data root"""
    epochs: Annotated[PositiveInt | None, TASK_DEFAULT] = None
    """maximum epochs"""
    batch_size: Annotated[PositiveInt | None, TASK_DEFAULT] = None
    """minibatch size"""
    lr: Annotated[PositiveFloat | None, TASK_DEFAULT] = None
    """learning rate"""
    seed: NonNegativeInt = 0
    """seed for the split, initialisation, batch order and sampling"""
    resume: bool = False
    """continue the run in --out where its last finished epoch left off (rerunning its command does the same)"""
    resume_with_changes: bool = False
    """continue the run in --out with settings that differ from its own (data, options, controller), recorded in
    config.json"""
    set: Annotated[tuple[str, ...], tyro.conf.arg(help_behavior_hint="(default: none)")] = ()
    """KEY=VALUE overrides: controller fields (n_heads=2, encoder.d_model=32), task.KEY, trainer.KEY (listed below)"""
    device: str = "cpu"
    """torch device"""
    progress: bool = True
    """show progress bars"""
    threads: NonNegativeInt = 0
    """torch intra-op CPU threads (0: auto, half the CPUs this process may use, at least 1 — on a 2-core machine
    torch's own 2 threads trained an NSAC epoch in 18.8 s, one thread in 10.9 s: the other core feeds the batches)"""


def auto_threads() -> int:
    """Half the CPUs available to this process (its affinity mask), at least one."""
    return max(1, len(os.sched_getaffinity(0)) // 2)


# trainer keys the command's own flags set (--set trainer.KEY still overrides them)
FLAGGED = ("epochs", "batch_size", "lr", "seed", "device", "progress", "resume")


def epilog() -> str:
    """The `--set` keys, grouped: task options, controller fields, trainer keys; one line each with its default."""
    return "\n\n".join([tasks.help_text(), controller_help(), trainer_help()])


def controller_help() -> str:
    registered = fields.registry("agents.registry", "CONTROLLERS")
    names = {where: name for name, where in registered.items()}
    lines = [
        "controller fields (--set KEY=VALUE; out_dim and encoder.kind, .in_dim, .n_tokens are the task's, which "
        "may also suggest other defaults):",
        "  every controller",
        *fields.help_lines(
            [f for f in fields.dataclass_fields("agents.encoders", "EncoderConfig") if f.name == "d_model"], "encoder."
        ),
    ]
    for name, (module, cls) in registered.items():
        own = fields.dataclass_fields(module, cls)
        parent = next((names[b] for b in fields.bases(module, cls) if b in names), None)
        shared = set(fields.dataclass_fields(*registered[parent])) if parent else set()
        shown = [f for f in own if f not in shared and f.name not in ("encoder", "out_dim")]
        lines.append(f"  {name} ({fields.summary(module)}" + (f"; {parent}'s fields and:" if parent else "") + ")")
        lines.extend(fields.help_lines(shown))
    return "\n".join(lines)


def trainer_help() -> str:
    keys = [f for f in fields.dataclass_fields("drive.learn.options", "TrainerConfig") if f.name not in FLAGGED]
    own = {name: tasks.select_of(name) for name in tasks.TASKS}
    differ = sorted({s for s in own.values()} - {next(f.default.strip("'") for f in keys if f.name == "select")})
    by_task = "; ".join(f"{s} for {', '.join(n for n, v in own.items() if v == s)}" for s in differ)
    keys = [
        f._replace(doc=f"{f.doc} (the default unless the task sets its own: {by_task})")
        if f.name == "select" and by_task
        else f
        for f in keys
    ]
    title = f"trainer keys (--set trainer.KEY=VALUE; {', '.join(FLAGGED)}: the options above):"
    return "\n".join([title, *fields.help_lines(keys, "trainer.")])


def run(cfg: Config) -> int:
    # the engine, imported when a run starts: `drive train --help` (the Config above) must not load torch
    import torch

    from drive.learn import distributed
    from drive.learn.experiment import TrainRequest, follow, summary, train_and_evaluate

    torch.set_num_threads(cfg.threads or auto_threads())
    argv = sys.argv[2:] if sys.argv[1:2] == ["train"] else []
    with distributed.session(cfg.device) as device:
        world = {"world_size": distributed.world_size()} if distributed.active() else {}
        # a run already in --out is continued, as `drive collect` continues its dataset: rerunning is resuming
        resume = cfg.resume or (Path(cfg.out) / "config.json").is_file()
        request = TrainRequest(
            controller=cfg.controller,
            out=cfg.out,
            task=cfg.task,
            data=cfg.data,
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            seed=cfg.seed,
            resume=resume,
            resume_with_changes=cfg.resume_with_changes,
            overrides=cfg.set,
            device=device,
            progress=cfg.progress and distributed.is_main(),
            extra=world,
            command="drive train " + " ".join(argv) if argv else "drive train",
        )
        if not distributed.is_main():
            follow(request)
            return 0
        report = train_and_evaluate(request)
    print(summary(report))
    return 0
