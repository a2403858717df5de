"""The misbehaviour benchmark's run as a dataset, and your own monitor scored on it (`drive bench misbehaviour
--monitor`, `--from-records`).

Records: `DIR/records/<controller>.parquet`, one file per controller (its checkpoint path made file-name safe, as
its cells folder is named), written atomically by every `drive bench misbehaviour` (`--report-only` too) from the
finished ungated cells. Prevention cells are not records: the fallback changed what the car did. One row per
(controller, condition, episode, step):

    controller    str      the checkpoint, a path relative to the working directory
    condition     str      `nominal` or the shift spec (drive/perturb/registry.py grammar)
    family        str      the shift family: nominal, blur, fog, ..., user:module:function
    group         str      nominal; held_out (a family no method trained on: the headline); surrogate (a family NSAC's
                           training surrogate draws from: noise, brightness) (report.py `groups`)
    seed          int64    the episode's track seed
    step          int64    the step index 0..T-1 (50 steps per second of simulated time)
    nominal       bool     condition == nominal: the false-positive windows and the thresholds come from these
    busy          bool     the car is inside a misbehaviour at this step (off-track, spinning, stalled)
    onset         bool     a misbehaviour begins at this step (the protocol's TTM windows end here)
    misbehaviour  str      the kinds that begin at this step, joined by "+" ("" where none begins)
    <monitor>     float    one column per monitor, its score at this step (higher: more alarmed), in the order the
                           report lists them: the controller's epistemic_steer, aleatoric_steer, total_steer,
                           epistemic_sum; selforacle (with --selforacle); thirdeye_avg, thirdeye_avg_grad; then
                           user:<function> per --monitor. float32 as recorded (user: float64); NaN where the
                           controller gave no prediction.

File metadata (key b"drive"): JSON {"format": 1, "controller", "position" (its place in the run's --ckpt list),
"monitors"}. Rows come in the order the report scores them: nominal first, the shifts in command order, episodes by
seed, steps ascending. `--from-records DIR` (DIR or DIR/records) scores every *.parquet there through the same
`report.prediction` as a run (the same rows), without driving; prevention needs driving and is skipped.
A file made by hand needs only condition, seed, step, busy and onset and one floating-point column: controller
defaults to the file name, family and group to what the condition's spec names, every floating-point column that is
not a label is a monitor.

Your monitor, `--monitor module:function` (the module on the PYTHONPATH): `function(record) -> scores`, where
`record` maps `step` and every recorded score column except other user monitors, each (T,) numpy, of one episode,
and `scores` is (T,) finite floats, the score at each step. The labels (busy, onset), the condition and the seed are
withheld: a runtime monitor does not have them. The score at step t may use steps <= t only; each episode is scored
again with its second half withheld and the first half's scores must stay the same, so a monitor that reads the
future (a centred smoothing, a per-episode normalisation) is refused rather than credited with knowledge no runtime
monitor has. The function sees recorded scores, not frames (cells keep no frames), so it runs alike after a live run
and on records; its column is `user:<function>`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datasets.files import atomic_path
from datasets.root import portable
from drive.errors import UserError
from drive.studies.misbehaviour import report as report
from drive.studies.misbehaviour.report import NOMINAL

FORMAT = 1
META_KEY = b"drive"
LABELS = ("controller", "condition", "family", "group", "seed", "step", "nominal", "busy", "onset", "misbehaviour")
REQUIRED = ("condition", "seed", "step", "busy", "onset")
UNKNOWN_KIND = "misbehaviour"  # a hand-made record's onset without a misbehaviour column


@dataclass(frozen=True)
class UserMonitor:
    spec: str  # module:function
    function: Callable[[Mapping[str, np.ndarray]], Any]

    @property
    def name(self) -> str:
        return "user:" + self.spec.rpartition(":")[2]


def load_monitors(specs: Sequence[str]) -> tuple[UserMonitor, ...]:
    """Each `module:function` imported (UserError in one line naming the spec where it cannot be)."""
    monitors = tuple(_load(spec) for spec in specs)
    names = [m.name for m in monitors]
    twice = next((m for m in monitors if names.count(m.name) > 1), None)
    if twice is not None:
        raise UserError(
            f"--monitor {twice.spec!r}: another --monitor is also named {twice.name!r} (a monitor is named "
            "by its function): rename one"
        )
    return monitors


def _load(spec: str) -> UserMonitor:
    module, sep, name = spec.rpartition(":")
    if not sep or not module or not name.isidentifier():
        raise UserError(
            f"--monitor {spec!r}: expected module:function, a function of one episode's record importable "
            "from the PYTHONPATH"
        )
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # any failure to import is the user's module, reported as one line
        raise UserError(f"--monitor {spec!r}: cannot import module {module!r} ({type(exc).__name__}: {exc})") from None
    if not callable(getattr(mod, name, None)):
        raise UserError(f"--monitor {spec!r}: module {module!r} has no function {name!r}")
    return UserMonitor(spec, getattr(mod, name))


def _call(monitor: UserMonitor, record: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    try:
        out = monitor.function({k: v.copy() for k, v in record.items()})
    except Exception as exc:
        raise UserError(f"--monitor {monitor.spec!r}: raised {type(exc).__name__}: {exc}") from None
    try:
        scores = np.asarray(out, np.float64)
    except (TypeError, ValueError):
        raise UserError(f"--monitor {monitor.spec!r}: returned {type(out).__name__}, not an array of numbers") from None
    if scores.shape != (n,):
        raise UserError(
            f"--monitor {monitor.spec!r}: returned shape {scores.shape} for an episode of {n} steps; a "
            f"monitor returns one score per step, shape ({n},)"
        )
    bad = np.flatnonzero(~np.isfinite(scores))
    if len(bad):
        raise UserError(f"--monitor {monitor.spec!r}: score {scores[bad[0]]} at step {bad[0]}; scores must be finite")
    return scores


def monitor_scores(monitor: UserMonitor, scores: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """The monitor's (n,) scores of one episode from its recorded scores, checked (see the module docstring)."""
    record = {"step": np.arange(n), **{k: np.asarray(v) for k, v in scores.items() if not k.startswith("user:")}}
    out = _call(monitor, record, n)
    half = n // 2
    if half:
        early = _call(monitor, {k: v[:half] for k, v in record.items()}, half)
        moved = np.flatnonzero(~np.isclose(early, out[:half], rtol=1e-6, atol=1e-12))
        if len(moved):
            raise UserError(
                f"--monitor {monitor.spec!r}: its score at step {moved[0]} changes when steps {half}.. "
                f"are withheld; a monitor's score at step t may use steps <= t only"
            )
    return out


def with_monitors(cells: Mapping[str, Mapping[str, Any]], monitors: Sequence[UserMonitor]) -> Mapping[str, Any]:
    """`cells` ({condition: cell}), each episode's `scores` (report.scores_of) extended in place by the
    user monitors' (replacing a recorded column of the same name)."""
    for cell in cells.values() if monitors else ():
        for ep in cell["episodes"]:
            scores = report.scores_of(ep)
            n = len(ep["busy"])
            ep["scores"] = {**scores, **{m.name: monitor_scores(m, scores, n) for m in monitors}}
    return cells


def _family_group(condition: str) -> tuple[str, str]:
    if condition == NOMINAL:
        return NOMINAL, NOMINAL
    name, surrogate = report.family(condition)
    return name, "surrogate" if surrogate else "held_out"


def _episode_table(controller: str, condition: str, ep: Mapping[str, Any], monitors: list[str]) -> pa.Table:
    scores = report.scores_of(ep)
    n = len(ep["busy"])
    if list(scores) != monitors or any(len(v) != n for v in scores.values()):
        raise ValueError(
            f"records of {controller}, {condition}, seed {ep['seed']}: monitors {list(scores)} of "
            f"lengths {[len(v) for v in scores.values()]}, expected {monitors} of {n} steps"
        )
    onset, kinds = np.zeros(n, bool), [""] * n
    for event in ep.get("events", []):
        t = int(event["t"])
        if not 0 <= t < n:
            raise ValueError(f"records of {controller}, {condition}, seed {ep['seed']}: onset {t} outside 0..{n - 1}")
        onset[t] = True
        kinds[t] = "+".join(k for k in (kinds[t], str(event.get("kind", UNKNOWN_KIND))) if k)
    name, group = _family_group(condition)
    columns: dict[str, Any] = {
        "controller": [controller] * n,
        "condition": [condition] * n,
        "family": [name] * n,
        "group": [group] * n,
        "seed": np.full(n, int(ep["seed"]), np.int64),
        "step": np.arange(n, dtype=np.int64),
        "nominal": np.full(n, condition == NOMINAL),
        "busy": np.asarray(ep["busy"], bool),
        "onset": onset,
        "misbehaviour": kinds,
    }
    columns |= {m: np.asarray(v) for m, v in scores.items()}
    types = {
        "controller": pa.string(),
        "condition": pa.string(),
        "family": pa.string(),
        "group": pa.string(),
        "misbehaviour": pa.string(),
    }
    return pa.table({k: pa.array(v, types.get(k)) for k, v in columns.items()})


def write_records(path: Path, controller: str, cells: Mapping[str, Mapping[str, Any]], position: int = 0) -> Path:
    """One controller's ungated cells ({condition: cell}, nominal first) as its records file, written atomically."""
    controller = portable(controller)
    episodes = [(c, ep) for c, cell in cells.items() for ep in cell["episodes"]]
    monitors = list(report.scores_of(episodes[0][1])) if episodes else []
    tables = [_episode_table(controller, c, ep, monitors) for c, ep in episodes]
    if not tables:
        raise ValueError(f"records of {controller}: no episode to write")
    meta = {"format": FORMAT, "controller": controller, "position": position, "monitors": monitors}
    table = pa.concat_tables(tables).replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


# -- reading -----------------------------------------------------------------------------------------------------------
def record_files(folder: Path) -> list[Path]:
    """The records files of a run's out dir or its records/ folder, in the run's controller order."""
    base = folder / "records" if (folder / "records").is_dir() else folder
    files = sorted(p for p in base.glob("*.parquet") if not p.name.startswith(".")) if base.is_dir() else []
    if not files:
        raise UserError(
            f"--from-records {folder}: no records there (expected {folder}/records/*.parquet as "
            "drive bench misbehaviour writes them, or *.parquet files in the folder itself)"
        )
    return sorted(files, key=lambda p: _position(p))


def _position(path: Path) -> tuple[int, str]:
    try:
        raw = (pq.read_schema(path).metadata or {}).get(META_KEY)
        return int(json.loads(raw)["position"]) if raw else 1 << 30, path.name
    except (pa.ArrowInvalid, OSError, ValueError, KeyError, TypeError):
        return 1 << 30, path.name  # unreadable: read_records names it


class _Rows(NamedTuple):
    """A run of consecutive rows of one episode (a file may split an episode; its rows are joined by step)."""

    step: np.ndarray
    busy: np.ndarray
    onset: np.ndarray
    kinds: np.ndarray | None
    scores: dict[str, np.ndarray]


def read_records(folder: Path) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[str, bool]]]:
    """({controller: {condition: {"episodes": [...]}}} (nominal first), {condition: (family, surrogate)}): each
    episode {"seed", "events", "busy", "scores"}, the shape report.prediction scores."""
    episodes: dict[tuple[str, str, int], list[_Rows]] = {}
    families: dict[str, tuple[str, bool]] = {}
    for path in record_files(folder):
        _read_file(path, episodes, families)
    out: dict[str, dict[str, Any]] = {}
    for (controller, condition, seed), parts in episodes.items():
        cells = out.setdefault(controller, {})
        cells.setdefault(condition, {"episodes": []})["episodes"].append(_episode(controller, condition, seed, parts))
    for controller, cells in out.items():
        if NOMINAL not in cells:
            raise UserError(
                f"--from-records {folder}: {controller} has no nominal episodes (condition {NOMINAL!r}): "
                "the thresholds are fitted on them"
            )
        sets = {tuple(ep["scores"]) for cell in cells.values() for ep in cell["episodes"]}
        if len(sets) > 1:
            raise UserError(
                f"--from-records {folder}: the episodes of {controller} hold different monitors "
                f"{sorted(sets)}; every episode needs the same"
            )
        out[controller] = {NOMINAL: cells[NOMINAL], **{c: v for c, v in cells.items() if c != NOMINAL}}
    return out, families


def _read_file(
    path: Path, episodes: dict[tuple[str, str, int], list[_Rows]], families: dict[str, tuple[str, bool]]
) -> None:
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"{path}: not a readable Parquet file ({' '.join(str(exc).split())})") from None
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise UserError(
            f"{path}: records lack column(s) {missing} (the schema: drive/studies/misbehaviour/records.py "
            "or docs/misbehaviour.md)"
        )
    holes = [c for c in LABELS if c in table.column_names and table.column(c).null_count]
    monitors = [f.name for f in table.schema if f.name not in LABELS and pa.types.is_floating(f.type)]
    if holes or not monitors:
        raise UserError(
            f"{path}: "
            + (
                f"missing values in {holes}"
                if holes
                else f"no monitor column (a floating-point column besides {list(LABELS)})"
            )
        )
    col = {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}
    n = table.num_rows
    controller = col["controller"] if "controller" in col else np.full(n, path.stem, object)
    condition, seed = col["condition"], col["seed"].astype(np.int64)
    if "nominal" in col and np.any(col["nominal"].astype(bool) != (condition == NOMINAL)):
        raise UserError(f"{path}: `nominal` disagrees with `condition` (nominal episodes are condition {NOMINAL!r})")
    cut = (
        np.flatnonzero(
            (controller[1:] != controller[:-1]) | (condition[1:] != condition[:-1]) | (seed[1:] != seed[:-1])
        )
        + 1
    )
    kinds = col.get("misbehaviour")
    for start, stop in zip(np.r_[0, cut], np.r_[cut, n], strict=True):
        key = (str(controller[start]), str(condition[start]), int(seed[start]))
        if key[1] not in families:
            families[key[1]] = _family_of(path, key[1], col, start)
        rows = slice(start, stop)
        episodes.setdefault(key, []).append(
            _Rows(
                col["step"][rows],
                col["busy"][rows].astype(bool),
                col["onset"][rows].astype(bool),
                None if kinds is None else kinds[rows],
                {m: col[m][rows] for m in monitors},
            )
        )


def _family_of(path: Path, condition: str, col: Mapping[str, np.ndarray], row: int) -> tuple[str, bool]:
    if "family" in col and "group" in col:
        return str(col["family"][row]), str(col["group"][row]) == "surrogate"
    if condition == NOMINAL:
        return NOMINAL, False
    try:
        return report.family(condition)
    except ValueError as exc:
        raise UserError(
            f"{path}: condition {condition!r}: {exc} (give family and group columns to score it without its shift)"
        ) from None


def _episode(controller: str, condition: str, seed: int, parts: list[_Rows]) -> dict[str, Any]:
    step = np.concatenate([p.step for p in parts])
    order = np.argsort(step, kind="stable")
    if not np.array_equal(step[order], np.arange(len(step))) or any(
        p.scores.keys() != parts[0].scores.keys() for p in parts
    ):
        raise UserError(
            f"records of {controller}, {condition}, seed {seed}: the steps are not 0..T-1 each once, "
            "or its rows lie in files with other monitor columns"
        )

    def joined(get: Callable[[_Rows], Any]) -> np.ndarray:
        return np.concatenate([get(p) for p in parts])[order]

    onset = joined(lambda p: p.onset)
    kinds = joined(lambda p: p.kinds) if all(p.kinds is not None for p in parts) else np.full(len(step), "", object)
    events = [
        {"t": int(t), "kind": kind}
        for t in np.flatnonzero(onset)
        for kind in (str(kinds[t]) or UNKNOWN_KIND).split("+")
    ]
    scores = {m: np.concatenate([p.scores[m] for p in parts])[order] for m in parts[0].scores}
    return {"seed": seed, "events": events, "busy": joined(lambda p: p.busy), "scores": scores}
