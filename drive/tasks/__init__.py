"""Task plugins for `drive train`: each turns a data source into train/val datasets and its own held-out evaluation.

A task is a module path in `TASKS`, imported only when chosen, exposing

    build(cfg: TaskConfig) -> TaskData

`drive train` picks the task from `--task`, or from `--data`: `--data DIR` means task "demos" (recorded CarRacing
demonstrations), `--data udacity:DIR` task "udacity", no `--data` task "spiral". Task options come from
`--set task.KEY=VALUE` and reach the task as strings in `TaskConfig.options`; read them with `cfg.get(key,
default)` (cast to the default's type) and call `cfg.check_known(...)` so a misspelt option is an error, not a no-op.

The trainer knows nothing about tasks: it sees two datasets yielding `(x, y)` tensor pairs, `y` shaped (D,), and
calls two optional dataset hooks when present:
    set_epoch(epoch)  called before each epoch (e.g. spiral redraws its irregular observation times), deterministic
                      in (seed, epoch) so an interrupted run resumes exactly;
    targets           a (N, D) tensor of all training targets, used to fit the target standardisation without a
                      pass over the inputs (images);
    tensors           an (x, y) pair of tensors holding the whole current epoch: batches are sliced from it
                      directly instead of collated item by item.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.encoders import EncoderConfig

# task name -> module path (imported lazily: an optional dependency of one task cannot break the others)
TASKS: dict[str, str] = {
    "spiral": "drive.tasks.spiral",
    "demos": "drive.tasks.demos",
    "udacity": "drive.tasks.udacity",
}


@dataclass(frozen=True)
class TaskConfig:
    """What `drive train` hands to a task's `build`."""

    name: str
    data: Path | None = None
    """the data directory (the `udacity:` prefix already stripped), None for generated tasks"""
    seed: int = 0
    options: dict[str, str] = field(default_factory=dict)
    """`--set task.KEY=VALUE` pairs, values as strings"""

    def get(self, key: str, default: Any) -> Any:
        """Option `key` cast to the type of `default` (bools accept 1/0, true/false, yes/no)."""
        if key not in self.options:
            return default
        raw = self.options[key]
        try:
            if isinstance(default, bool):
                if raw.lower() in ("1", "true", "yes", "on"):
                    return True
                if raw.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(raw)
            return type(default)(raw) if default is not None else raw
        except ValueError:
            kind = type(default).__name__
            raise ValueError(f"task {self.name!r}: option task.{key}={raw!r} is not a valid {kind}") from None

    def check_known(self, known: Iterable[str]) -> None:
        unknown = sorted(set(self.options) - set(known))
        if unknown:
            raise ValueError(f"task {self.name!r}: unknown option(s) {unknown}; known: {sorted(known)}")

    def require_data(self) -> Path:
        if self.data is None:
            raise ValueError(f"task {self.name!r} needs a data directory (--data)")
        if not self.data.exists():
            raise FileNotFoundError(f"task {self.name!r}: data path {self.data} does not exist")
        return self.data


@dataclass
class TaskData:
    """Everything `drive train` needs from a task."""

    name: str
    train: Any
    """torch Dataset of (x, y) pairs; y shaped (D,) in original units"""
    val: Any
    """held-out torch Dataset of (x, y) pairs for early stopping (validation NLL)"""
    encoder: EncoderConfig
    """the input encoding the controller must use (kind, in_dim, n_tokens; d_model is a default)"""
    out_dim: int
    target_names: tuple[str, ...]
    fingerprint: dict[str, Any]
    """identifies the training data: primitives only (sha256 of a manifest, generator recipe + seed, path)"""
    evaluate: Callable[[Any], dict]
    """evaluate(trained controller) -> the task's held-out metrics (nested dicts of floats), merged into metrics.json"""
    controller_defaults: dict[str, Any] = field(default_factory=dict)
    """controller config fields the task suggests (dotted keys like encoder.d_model), applied where the controller
    has the field; --set overrides them"""
    train_defaults: dict[str, Any] = field(default_factory=dict)
    """trainer fields the task suggests (epochs, batch_size, lr, patience, ...); CLI flags override them"""


def resolve(task: str | None, data: str | None) -> TaskConfig:
    """Task name and data path from `--task` / `--data` (`DIR` -> demos, `udacity:DIR` -> udacity)."""
    path: Path | None = None
    inferred = "spiral"
    if data:
        if data.startswith("udacity:"):
            inferred, path = "udacity", Path(data[len("udacity:") :])
        else:
            inferred, path = "demos", Path(data)
    name = task or inferred
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
    if task and data and task != inferred:
        raise ValueError(f"--task {task} conflicts with --data {data!r} (which means task {inferred!r})")
    return TaskConfig(name=name, data=path)


def load(cfg: TaskConfig) -> TaskData:
    try:
        module = importlib.import_module(TASKS[cfg.name])
    except ModuleNotFoundError as exc:
        if exc.name == TASKS[cfg.name]:
            raise ValueError(f"task {cfg.name!r} is registered but its module {TASKS[cfg.name]} is missing") from exc
        raise
    data = module.build(cfg)
    if not isinstance(data, TaskData):
        raise TypeError(f"{TASKS[cfg.name]}.build returned {type(data).__name__}, expected TaskData")
    return data
