"""`drive train`: train a controller (NSAC or a baseline) on a task plugin and write RUNDIR/metrics.json.

    drive train --controller gmle --out runs/spiral-gmle                    # the irregular spiral (default task)
    drive train --controller nsac --data runs/demos --out runs/bc-nsac      # recorded CarRacing demonstrations
    drive train --controller de --data udacity:../shared/data/udacity_sim --out runs/udacity-de
    drive train ... --resume                                                # continue an interrupted run exactly
    drive train ... --set n_heads=2 encoder.d_model=32 task.n_freqs=4 trainer.patience=5

The task (drive/tasks) supplies datasets, the input encoding and its held-out evaluation; the controller config is
built from the registry with the task's encoder and output width, then the task's suggested defaults, then
`--set` overrides. Training is drive/trainer.py; the best checkpoint is reloaded from disk (so what is evaluated is
what was saved) and the task's evaluation is written to metrics.json with the validation report.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from drive import checkpoint, metrics, tasks, trainer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    controller: str
    """controller to train: nsac, gmle, mcd, de, der, sdenet"""
    out: Path
    """run directory (config, metrics log, TensorBoard, checkpoints, metrics.json)"""
    task: str | None = None
    """task plugin: spiral, demos, udacity (default: inferred from --data, spiral without it)"""
    data: str | None = None
    """DIR: recorded demonstrations (task demos); udacity:DIR: a Udacity simulator log (task udacity)"""
    epochs: int | None = None
    """maximum epochs (default: the task's)"""
    batch_size: int | None = None
    """minibatch size (default: the task's)"""
    lr: float | None = None
    """AdamW learning rate (default: the task's)"""
    seed: int = 0
    """seed for data generation, initialisation, batch order and sampling"""
    resume: bool = False
    """continue the interrupted run in --out exactly where its last finished epoch left off"""
    set: tuple[str, ...] = ()
    """KEY=VALUE overrides: controller fields (n_heads=2, encoder.d_model=32), task.KEY, trainer.KEY"""
    device: str = "cpu"
    """torch device"""
    progress: bool = True
    """show progress bars"""
    threads: int = 0
    """torch intra-op CPU threads (0: torch's default; 1 is fastest for small models on a busy machine)"""


def parse_overrides(items: tuple[str, ...]) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Split `--set` items into (controller, task, trainer) overrides."""
    groups: dict[str, dict[str, str]] = {"controller": {}, "task": {}, "trainer": {}}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        prefix, dot, rest = key.partition(".")
        if dot and prefix in ("task", "trainer"):
            groups[prefix][rest] = value
        else:
            groups["controller"][key] = value
    return groups["controller"], groups["task"], groups["trainer"]


def _cast(value: Any, hint: Any, where: str) -> Any:
    if not isinstance(value, str):
        return value
    target = hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value.lower() == "none":
            return None
        target = args[0] if args else str
    try:
        if target is bool:
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if typing.get_origin(target) is tuple:
            inner = typing.get_args(target)[0]
            return tuple(inner(v) for v in value.split(",") if v)
        return target(value)
    except (TypeError, ValueError):
        raise ValueError(f"--set {where}={value!r}: not a valid {getattr(target, '__name__', target)}") from None


def apply_overrides(cfg: Any, overrides: dict[str, Any], where: str = "") -> Any:
    """dataclasses.replace with dotted keys (encoder.d_model) and string values cast to the field types."""
    hints = typing.get_type_hints(type(cfg))
    fields = {f.name for f in dataclasses.fields(cfg)}
    nested: dict[str, dict[str, Any]] = {}
    flat: dict[str, Any] = {}
    for key, value in overrides.items():
        head, dot, rest = key.partition(".")
        full = f"{where}{key}"
        if head not in fields:
            raise ValueError(f"--set {full}: {type(cfg).__name__} has no field {head!r}; fields: {sorted(fields)}")
        if dot:
            nested.setdefault(head, {})[rest] = value
        else:
            flat[head] = _cast(value, hints[head], full)
    for head, sub in nested.items():
        flat[head] = apply_overrides(getattr(cfg, head), sub, f"{where}{head}.")
    return dataclasses.replace(cfg, **flat)


def build_controller_config(name: str, data: tasks.TaskData, overrides: dict[str, str]):
    from agents.registry import CONTROLLERS

    if name not in CONTROLLERS:
        raise ValueError(f"unknown controller {name!r}; registered: {sorted(CONTROLLERS)}")
    cfg = CONTROLLERS[name](encoder=data.encoder, out_dim=data.out_dim)
    # A task's suggestions may name fields only some controllers have (NSAC's time_feature): apply those that exist.
    fields = {f.name for f in dataclasses.fields(cfg)}
    cfg = apply_overrides(cfg, {k: v for k, v in data.controller_defaults.items() if k.split(".")[0] in fields})
    return apply_overrides(cfg, overrides)


def run(cfg: Config) -> int:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    ctrl_over, task_over, trainer_over = parse_overrides(cfg.set)
    task_cfg = dataclasses.replace(tasks.resolve(cfg.task, cfg.data), seed=cfg.seed, options=task_over)
    data = tasks.load(task_cfg)

    model_cfg = build_controller_config(cfg.controller, data, ctrl_over)
    train_cfg = apply_overrides(trainer.TrainerConfig(), data.train_defaults, "trainer.")
    flags = {"epochs": cfg.epochs, "batch_size": cfg.batch_size, "lr": cfg.lr}
    train_cfg = dataclasses.replace(
        train_cfg,
        **{k: v for k, v in flags.items() if v is not None},
        seed=cfg.seed,
        resume=cfg.resume,
        device=cfg.device,
        progress=cfg.progress,
    )
    train_cfg = apply_overrides(train_cfg, trainer_over, "trainer.")

    from agents.registry import config_to_dict

    torch.manual_seed(cfg.seed)
    model = model_cfg.build()
    info = trainer.CheckpointInfo(
        name=cfg.controller,
        config=config_to_dict(model_cfg),
        data={"task": data.name, **data.fingerprint},
        target_names=tuple(data.target_names),
        extra={
            "command": "drive train " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["train"] else "drive train",
            "task": data.name,
            "seed": cfg.seed,
        },  # fmt: skip
    )
    n_params = sum(p.numel() for p in model.parameters())
    print(f"training {cfg.controller} ({n_params:,} parameters) on task {data.name} -> {cfg.out}")
    t0 = time.perf_counter()
    result = trainer.fit(model, data.train, data.val, train_cfg, cfg.out, info)
    train_s = time.perf_counter() - t0

    # Evaluate exactly what was saved: reload the best checkpoint from disk.
    model, _ = checkpoint.load_controller(result.best_path)
    model.to(cfg.device)
    pred, y = trainer.predict_dataset(model, data.val, train_cfg.batch_size, None, cfg.seed, cfg.device)
    t1 = time.perf_counter()
    evaluation = data.evaluate(model)
    report = {
        "task": data.name,
        "controller": cfg.controller,
        "fit": {
            "best_epoch": result.best_epoch,
            "best_val_nll": result.best_val_nll,
            "epochs_run": result.epochs_run,
            "stopped_early": result.stopped_early,
            "train_seconds": train_s,
            "eval_seconds": time.perf_counter() - t1,
            "n_parameters": n_params,
        },  # fmt: skip
        "val": metrics.regression_report(pred, y),
        **evaluation,
    }
    out = Path(cfg.out) / "metrics.json"
    out.write_text(json.dumps(report, indent=2))
    print(_summary(report))
    print(f"wrote {out}")
    return 0


def _summary(report: dict) -> str:
    lines = [f"{report['controller']} on {report['task']}: best epoch {report['fit']['best_epoch']}, "
             f"val nll {report['fit']['best_val_nll']:.4f}, {report['fit']['train_seconds']:.0f} s"]  # fmt: skip
    for split, values in report.items():
        if isinstance(values, dict) and all(k in values for k in ("mse", "nll", "crps", "ece")):
            lines.append(f"  {split:<14} mse {values['mse']:.5f}  nll {values['nll']:8.4f}  "
                         f"crps {values['crps']:.4f}  ece {values['ece']:.4f}")  # fmt: skip
    return "\n".join(lines)
