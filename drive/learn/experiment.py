"""One training run: a task, a controller, the trainer, and the run directory's metrics.json.

`train_and_evaluate(request)` builds the task (drive/learn/tasks), the controller config from the registry with
the task's encoder and output width, then the task's suggested defaults, then `--set` overrides; trains
(drive/learn/trainer.py); reloads the best checkpoint from disk (so what is evaluated is what was saved); writes
the validation report and the task's held-out evaluation to RUN/metrics.json, the test split's predictive to
RUN/predictions.npz (mean, aleatoric_var, epistemic_var, y; (N, D) each) and the task's plots beside them.
A resumed request (`resume`, which `drive train` sets when --out already holds a run) continues the run where its
last finished epoch left off, is refused when its settings differ from the run's (`check_resume`), and returns the
run's metrics.json untouched when nothing is left to do. `drive train` and `drive bench offline` run it.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.registry import CONTROLLERS, config_from_dict, config_to_dict
from datasets.files import atomic_write
from datasets.root import portable, portable_command
from drive import checkpoint, metrics
from drive.errors import UserError
from drive.learn import tasks
from drive.learn.batches import predict_dataset
from drive.learn.overrides import apply_overrides, parse_overrides
from drive.learn.trainer import CheckpointInfo, FitResult, TrainerConfig, fit


@dataclass(frozen=True)
class TrainRequest:
    controller: str
    out: Path
    task: str | None = None
    data: str | None = None
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    seed: int = 0
    resume: bool = False
    resume_with_changes: bool = False
    overrides: tuple[str, ...] = ()
    device: str = "cpu"
    progress: bool = True
    command: str = "drive train"
    extra: dict[str, Any] = field(default_factory=dict)


def controller_config(name: str, data: tasks.TaskData, overrides: dict[str, str]) -> Any:
    """The registry's config for `name` with the task's encoder and width, its suggestions, then the overrides."""
    if name not in CONTROLLERS:
        raise UserError(f"unknown controller {name!r}; registered: {', '.join(CONTROLLERS)}")
    try:
        cfg = CONTROLLERS[name](encoder=data.encoder, out_dim=data.out_dim)
    except (TypeError, ValueError) as exc:
        raise UserError(f"controller {name!r} cannot take task {data.name!r}'s input: {exc}") from None
    fields = {f.name for f in dataclasses.fields(cfg)}  # suggestions may name fields only some controllers have
    cfg = apply_overrides(cfg, {k: v for k, v in data.controller_defaults.items() if k.split(".")[0] in fields})
    return apply_overrides(cfg, overrides)


def trainer_config(req: TrainRequest, data: tasks.TaskData, overrides: dict[str, str]) -> TrainerConfig:
    cfg = apply_overrides(TrainerConfig(), data.train_defaults, "trainer.")
    flags = {"epochs": req.epochs, "batch_size": req.batch_size, "lr": req.lr}
    cfg = dataclasses.replace(
        cfg,
        **{k: v for k, v in flags.items() if v is not None},
        seed=req.seed,
        resume=req.resume,
        device=req.device,
        progress=req.progress,
    )
    cfg = apply_overrides(cfg, overrides, "trainer.")
    if cfg.epochs < 1 or cfg.batch_size < 1 or cfg.lr <= 0:
        raise UserError(
            f"--epochs and --batch-size must be >= 1 and --lr > 0, got {cfg.epochs}, {cfg.batch_size}, {cfg.lr}"
        )
    return cfg


def prepare(req: TrainRequest) -> tuple[tasks.TaskData, Any, TrainerConfig]:
    """Task data, controller config and trainer config of a request; every option checked, nothing written."""
    if req.controller not in CONTROLLERS:
        raise UserError(f"unknown controller {req.controller!r}; registered: {', '.join(CONTROLLERS)}")
    ctrl_over, task_over, trainer_over = parse_overrides(req.overrides)
    name, path = tasks.resolve(req.task, req.data)
    opts = tasks.options(name, task_over)
    data = tasks.load(name, opts, path, req.seed)
    return data, controller_config(req.controller, data, ctrl_over), trainer_config(req, data, trainer_over)


# trainer fields a resumed run may change freely (they do not change what is trained); epochs may grow
FREE_ON_RESUME = ("resume", "progress", "device", "num_workers", "tensorboard", "epochs")


def _diff(old: Any, new: Any, where: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new)) for d in _diff(old.get(k), new.get(k), f"{where}.{k}")]
    return [] if json.dumps(old, default=str) == json.dumps(new, default=str) else [where.lstrip(".")]


def _stored_config(name: Any, stored: Any) -> Any:
    """A run's stored controller config with the fields added since it was written at their defaults (what that run
    trained with: a new field's default keeps the old behaviour), so a resume does not count them as changes."""
    if not isinstance(stored, dict) or name not in CONTROLLERS:
        return stored
    try:
        return config_to_dict(config_from_dict(name, stored))
    except (TypeError, ValueError):
        return stored


def resume_changes(
    req: TrainRequest, data: tasks.TaskData, model_cfg: Any, train_cfg: TrainerConfig, stored: dict[str, Any]
) -> list[str]:
    """The fields in which a request differs from the run whose config.json is `stored` (nothing written)."""
    trainer_now = {k: v for k, v in dataclasses.asdict(train_cfg).items() if k not in FREE_ON_RESUME}
    trainer_then = {k: v for k, v in stored.get("trainer", {}).items() if k not in FREE_ON_RESUME}
    changed = (
        _diff(stored.get("controller"), req.controller, "controller")
        + _diff(
            _stored_config(stored.get("controller"), stored.get("controller_config")),
            config_to_dict(model_cfg),
            "controller_config",
        )
        + _diff(stored.get("data"), json.loads(json.dumps(data.fingerprint, default=str)), "data")
        + _diff(trainer_then, json.loads(json.dumps(trainer_now, default=str)), "trainer")
    )
    if stored.get("trainer", {}).get("epochs", 0) > train_cfg.epochs:
        changed.append("trainer.epochs (fewer than the run already planned)")
    return changed


def check_resume(req: TrainRequest, data: tasks.TaskData, model_cfg: Any, train_cfg: TrainerConfig) -> list[str]:
    """The fields in which a resumed command (`drive train` resumes the run its --out holds) differs from that run
    (config.json): data, task options, controller, trainer. Refused (a UserError naming them) unless
    --resume-with-changes, which records them."""
    path = Path(req.out) / "config.json"
    if not req.resume or not path.is_file():
        return []
    stored = json.loads(path.read_text())
    changed = resume_changes(req, data, model_cfg, train_cfg, stored)
    if changed and not req.resume_with_changes:
        shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
        raise UserError(
            f"{req.out} holds a run with other settings than this command ({shown}): rerun the run's "
            "own command to continue it, pass --resume-with-changes to continue it with these changes "
            "recorded, or choose another --out"
        )
    grew = train_cfg.epochs > stored.get("trainer", {}).get("epochs", train_cfg.epochs)
    if grew:  # the schedule is planned over the new total from here on (drive/learn/trainer.py)
        stored.setdefault("trainer", {})["epochs"] = train_cfg.epochs
    if changed:
        stored.setdefault("resumed_with_changes", []).append(
            {"command": portable_command(req.command), "changed": changed}
        )
    if changed or grew:
        atomic_write(path, json.dumps(stored, indent=2, default=str).encode())
    return changed


def train_and_evaluate(req: TrainRequest) -> dict[str, Any]:
    """Train, reload the best checkpoint, evaluate; returns (and writes) metrics.json's dict."""
    data, model_cfg, train_cfg = prepare(req)
    changes = check_resume(req, data, model_cfg, train_cfg)
    done = None if changes else completed(req, train_cfg)
    if done is not None:
        early = ", stopped early" if done["fit"]["stopped_early"] else ""
        print(f"{req.out}: the run is complete ({done['fit']['epochs_run']} epochs{early}); nothing to train")
        return done
    finished = Path(req.out) / "metrics.json"
    if req.resume and finished.is_file():  # complete before, continued now: --epochs was raised
        ran = json.loads(finished.read_text()).get("fit", {}).get("epochs_run", "?")
        print(f"{req.out}: the run finished {ran} epochs; --epochs {train_cfg.epochs} extends it")
    torch.manual_seed(req.seed)
    model = model_cfg.build()
    info = CheckpointInfo(
        name=req.controller,
        config=config_to_dict(model_cfg),
        data=dict(data.fingerprint),
        target_names=tuple(data.target_names),
        extra={
            "command": portable_command(req.command),
            "task": data.name,
            "seed": req.seed,
            **req.extra,
            **({"resumed_with_changes": changes} if changes else {}),
        },
    )
    n_params = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"training {req.controller} ({n_params:,} parameters) on task {data.name} -> {req.out}")
    t0 = time.perf_counter()
    result = fit(model, data.train, data.val, train_cfg, req.out, info)
    report = evaluate_run(result, data, train_cfg, req, time.perf_counter() - t0, n_params, n_trainable)
    atomic_write(Path(req.out) / "metrics.json", json.dumps(report, indent=2).encode())
    print(f"wrote {Path(req.out) / 'metrics.json'}")
    return report


def completed(req: TrainRequest, train_cfg: TrainerConfig) -> dict[str, Any] | None:
    """metrics.json of the run a resumed request continues when it has nothing left to do: evaluated after its last
    epoch (or its early stop); None while epochs remain (an interrupted run, or --epochs raised) or none is there."""
    path = Path(req.out) / "metrics.json"
    if not req.resume or not path.is_file():
        return None
    report = json.loads(path.read_text())
    fit_report = report.get("fit", {})
    return report if fit_report.get("stopped_early") or fit_report.get("epochs_run", 0) >= train_cfg.epochs else None


def follow(req: TrainRequest) -> None:
    """A rank other than 0 under torchrun: the same data and model, trained on its part of each batch (the trainer
    keeps it in step with rank 0, which checks, writes and evaluates everything)."""
    data, model_cfg, train_cfg = prepare(req)
    config = Path(req.out) / "config.json"
    same = (
        not req.resume
        or not config.is_file()
        or not resume_changes(req, data, model_cfg, train_cfg, json.loads(config.read_text()))
    )
    if same and completed(req, train_cfg) is not None:  # rank 0 trains nothing either
        return
    torch.manual_seed(req.seed)
    fit(model_cfg.build(), data.train, data.val, train_cfg, req.out, CheckpointInfo(req.controller, {}))


def evaluate_run(
    result: FitResult,
    data: tasks.TaskData,
    train_cfg: TrainerConfig,
    req: TrainRequest,
    train_s: float,
    n_params: int,
    n_trainable: int | None = None,
) -> dict[str, Any]:
    """metrics.json's dict. Its "fit" says what the training took: epochs_run of the cap max_epochs, stopped_by
    "patience" (early stopping ended it: converged by that rule) or "cap" (it ran every epoch), gradient_steps
    (optimizer steps), cpu_seconds (the trainer's process CPU time over the epochs) beside train_seconds (wall
    time, this session's), n_parameters and n_trainable_parameters."""
    model, _ = checkpoint.load_controller(result.best_path)  # evaluate exactly what was saved
    model.to(req.device)
    pred, y = predict_dataset(model, data.val, train_cfg.batch_size, None, req.seed, req.device)
    t1 = time.perf_counter()
    evaluation = data.evaluate(model)
    save_predictions(Path(req.out) / "predictions.npz", model, data.test, train_cfg.batch_size, req.seed, req.device)
    out = Path(req.out)  # plots named relative to the run directory: metrics.json stores no machine's path
    plots = [_relative(Path(p), out) for p in data.plots(model, out)] if data.plots is not None else []
    best = next((row for row in result.history if row["epoch"] == result.best_epoch), {})
    fit_report = {
        "best_epoch": result.best_epoch,
        "select": train_cfg.select,
        "best_val_score": best.get(train_cfg.select, math.nan),
        "best_val_nll": result.best_val_nll,
        "epochs_run": result.epochs_run,
        "stopped_early": result.stopped_early,
        "train_seconds": train_s,
        "eval_seconds": time.perf_counter() - t1,
        "n_parameters": n_params,
        "n_trainable_parameters": n_params if n_trainable is None else n_trainable,
        "gradient_steps": result.gradient_steps,
        "cpu_seconds": result.cpu_seconds,
        "max_epochs": train_cfg.epochs,
        "patience": train_cfg.patience,
        "stopped_by": "patience" if result.stopped_early else "cap",
    }
    report = {
        "task": data.name,
        "controller": req.controller,
        "fit": fit_report,
        "val": metrics.regression_report(pred, y),
        **evaluation,
    }
    if plots:
        report["plots"] = plots
    return report


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(portable(str(path)))


def save_predictions(path: Path, model: Any, dataset: Any, batch_size: int, seed: int, device: str) -> None:
    """The test split's predictive (mean, aleatoric and epistemic variance, (N, D) each) and targets, for reports
    that pool runs (reliability diagrams, PIT histograms) without reloading models."""
    pred, y = predict_dataset(model, dataset, batch_size, None, seed, device)
    buf = io.BytesIO()
    np.savez_compressed(
        buf,
        mean=pred.mean.numpy(),
        aleatoric_var=pred.aleatoric_var.numpy(),
        epistemic_var=pred.epistemic_var.numpy(),
        y=y.numpy(),
    )
    atomic_write(path, buf.getvalue())


def summary(report: dict) -> str:
    fit_report = report["fit"]
    select = fit_report.get("select", "val_nll")  # metrics.json written before the field: selected on val_nll
    score = fit_report.get("best_val_score", fit_report["best_val_nll"])
    lines = [
        f"{report['controller']} on {report['task']}: best epoch {fit_report['best_epoch']} of "
        f"{fit_report['epochs_run']} (selected on {select.replace('_', ' ')} {score:.5g}), "
        f"{fit_report['train_seconds']:.0f} s"
    ]
    for split, values in report.items():
        if isinstance(values, dict) and all(k in values for k in ("mse", "nll", "crps", "ece")):
            lines.append(
                f"  {split:<14} mse {values['mse']:.5f}  nll {values['nll']:8.4f}  "
                f"crps {values['crps']:.4f}  ece {values['ece']:.4f}"
            )
    return "\n".join(lines)
