"""Task plugins for `drive train` and `drive bench offline`: each turns a data source into typed splits, the input
encoding, its held-out evaluation and its plots.

A task is one module in `TASKS` (imported only when chosen, so an optional dependency of one task cannot break the
others) exposing

    Options                                   a frozen dataclass: the task's options, field docstrings as help
    DATA: str                                 what `--data` means for it ("" when it takes no data)
    build(options, data, seed) -> TaskData    data: the `--data` path (None when not given)

`drive train --task NAME [--data DIR] [--set task.KEY=VALUE ...]` works for every task; `--data DIR` alone means
task "demos" and `--data udacity:DIR` task "udacity"; no --task and no --data: "spiral". Options are typed: each
`task.KEY=VALUE` is cast to its field's type and a misspelt key is an error naming the known ones; `drive train
--help` lists every task's options.

The trainer knows nothing about tasks: it sees `TaskData.train` and `.val`, datasets of `(x, y)` pairs with `y`
shaped (D,), and uses three optional dataset hooks:
    set_epoch(epoch)  called before each epoch (e.g. spiral redraws its irregular observation times), deterministic
                      in (seed, epoch) so an interrupted run resumes exactly;
    targets           a (N, D) tensor of all training targets (fits the target standardisation without a pass over
                      the inputs);
    tensors           an (x, y) pair of tensors holding the whole current epoch: batches are sliced from it directly.
`TaskData.fingerprint` records the task, its options, the seed and the data it read, so `rebuild(fingerprint)`
reconstructs the same splits later (`drive sa calibrate`, `drive results --checkpoint last`).

Offline benchmarks (`drive bench offline --task NAME`) also read, where a task module defines them:
    DATASETS: tuple[str, ...]     the names `--datasets` accepts (the Options field `dataset` selects one)
    PROTOCOLS: tuple[str, ...]    the protocols `--protocol` accepts (the Options field `protocol` selects one)
    PAPER: dict                   {protocol: {dataset: {controller: {metric: value}}}}: the paper's numbers
    CONTROLLERS: tuple[str, ...]  the controllers a full table runs
    SMOKE_OPTIONS: dict[str, str] `task.KEY=VALUE` options for a small, fast build (the contract test uses them)
Run s = 0..N-1 of a table cell is `drive train --task NAME --seed s --set task.dataset=D task.protocol=P`: the task
maps the run seed to its protocol's split (Gal's split index s, or the paper's seed 42 + s). metrics.json's "test"
is the report on the test split (drive.metrics.regression_report keys); a task with several test sets adds
"tests": {name: report}. RUN/predictions.npz holds the test split's predictive for pooled plots.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from datasets.root import portable
from drive import fields
from drive.errors import UserError
from drive.learn.overrides import apply_overrides

if TYPE_CHECKING:  # a type only: `drive train --help` reads this module and must not load torch
    from agents.encoders import EncoderConfig

# task name -> module path (imported lazily)
TASKS: dict[str, str] = {
    "spiral": "drive.learn.tasks.spiral",
    "demos": "drive.learn.tasks.demos",
    "udacity": "drive.learn.tasks.udacity",
    "bearings": "drive.learn.tasks.bearings",
    "uci": "drive.learn.tasks.uci",
    "forecast": "drive.learn.tasks.forecast",
    "sa-uci": "drive.learn.tasks.sa_uci",
    "sa-forecast": "drive.learn.tasks.sa_forecast",
}
DATA_PREFIXES = {"udacity:": "udacity"}  # `--data PREFIX:PATH` names the task


@dataclass
class TaskData:
    """Everything `drive train` needs from a task."""

    name: str
    train: Any
    """torch Dataset of (x, y) pairs; y shaped (D,) in original units"""
    val: Any
    """held-out Dataset for early stopping (validation NLL)"""
    test: Any
    """held-out Dataset the task's evaluation reports on"""
    encoder: EncoderConfig
    """the input encoding the controller must use (kind, in_dim, n_tokens; d_model is a default)"""
    out_dim: int
    target_names: tuple[str, ...]
    fingerprint: dict[str, Any]
    """identifies the data: primitives only (task, options, seed, path, sha256 of what was read)"""
    evaluate: Callable[[Any], dict]
    """evaluate(trained controller) -> the task's held-out metrics (nested dicts of floats) for metrics.json"""
    plots: Callable[[Any, Path], list[Path]] | None = None
    """plots(trained controller, run directory) -> PNG paths the task draws (None: none)"""
    standardiser: Any = None
    """the input standardiser fitted on the training split only (None for raw pixels): loc/scale arrays"""
    controller_defaults: dict[str, Any] = field(default_factory=dict)
    """controller config fields the task suggests (dotted keys like encoder.d_model), applied where the controller
    has the field; --set overrides them"""
    train_defaults: dict[str, Any] = field(default_factory=dict)
    """trainer fields the task suggests (epochs, batch_size, lr, patience, ...); CLI flags override them"""


def module(name: str) -> ModuleType:
    if name not in TASKS:
        raise UserError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
    return importlib.import_module(TASKS[name])


def resolve(task: str | None, data: str | None) -> tuple[str, Path | None]:
    """Task name and data path from `--task` / `--data` (`DIR` -> demos, `udacity:DIR` -> udacity)."""
    inferred, path = "spiral", None
    if data:
        inferred, rest = "demos", data
        for prefix, name in DATA_PREFIXES.items():
            if data.startswith(prefix):
                inferred, rest = name, data[len(prefix) :]
        path = Path(rest)
    name = task or inferred
    if name not in TASKS:
        raise UserError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
    if task and data and task != inferred and any(data.startswith(p) for p in DATA_PREFIXES):
        raise UserError(f"--task {task} conflicts with --data {data!r} (which means task {inferred!r})")
    if data and not module(name).DATA:
        raise UserError(f"task {name!r} takes no --data (it makes its own data): drop --data {data}")
    return name, path


def options(name: str, overrides: dict[str, str]) -> Any:
    """The task's Options with `task.KEY=VALUE` overrides cast to the field types (unknown keys are an error)."""
    cls = module(name).Options
    try:
        return apply_overrides(cls(), overrides, "task.")
    except (TypeError, ValueError) as exc:
        raise UserError(f"task {name!r}: {exc}") from None


def load(name: str, opts: Any, data: Path | None, seed: int = 0) -> TaskData:
    mod = module(name)
    paths = mod.data_paths(data) if data is not None and hasattr(mod, "data_paths") else [data]  # udacity:A,B
    if mod.DATA and data is not None and not all(p.exists() for p in paths):
        raise UserError(f"task {name!r}: data path {data} does not exist")
    built = mod.build(opts, data, seed)
    if not isinstance(built, TaskData):
        raise TypeError(f"{TASKS[name]}.build returned {type(built).__name__}, expected TaskData")
    built.fingerprint.setdefault("task", name)
    built.fingerprint.setdefault("options", dataclasses.asdict(opts))
    built.fingerprint.setdefault("seed", seed)
    built.fingerprint.update(portable(built.fingerprint))  # checkpoints name no folder of this machine
    return built


def rebuild(fingerprint: dict[str, Any]) -> TaskData:
    """The task data a checkpoint was trained on, from its data fingerprint (task, options, seed, path)."""
    name = fingerprint.get("task")
    if name not in TASKS:
        raise UserError(f"the checkpoint's data fingerprint names no known task ({name!r})")
    mod = module(name)
    if hasattr(mod, "rebuild"):  # a task whose fingerprints predate the options record rebuilds itself
        return mod.rebuild(fingerprint)
    opts = apply_overrides(mod.Options(), {k: v for k, v in fingerprint.get("options", {}).items()}, "task.")
    data = fingerprint.get("data_path")
    return load(name, opts, None if data is None else Path(data), int(fingerprint.get("seed", 0)))


def select_of(name: str) -> str:
    """The validation score a task selects on by default (its module's SELECT, else the trainer's `select`), read
    from source: no task is imported."""
    try:
        return str(fields.constant(TASKS[name], "SELECT"))
    except LookupError:
        return next(
            f.default for f in fields.dataclass_fields("drive.learn.options", "TrainerConfig") if f.name == "select"
        ).strip("'")


def help_text() -> str:
    """Every task's options for `drive train --help`, one line each (`task.KEY=DEFAULT  help`), read from the task
    modules' source (drive/fields.py) so that printing them loads no task, nor torch."""
    lines = ["task options (--set task.KEY=VALUE), each task with its defaults:"]
    for name, path in TASKS.items():
        data = fields.constant(path, "DATA")
        lines.append(
            f"  {name} (--task {name}; --data {data or 'none: it makes its own data'}; best.pt and early "
            f"stopping on {select_of(name)})"
        )
        lines.extend(fields.help_lines(fields.dataclass_fields(path, "Options"), "task."))
    return "\n".join(lines)
