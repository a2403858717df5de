"""`drive eval`: closed-loop evaluation of an expert or trained controller on track seeds.

    drive eval --expert ppo --seeds 1000-1019
    drive eval --ckpt runs/bc-nsac/best.pt --seeds 1000-1019 --out runs/bc-nsac/eval.json --trace DIR
    drive eval --ckpt checkpoints/udacity_nsac.pt --data udacity:DIR --out scores.json   # a driving log

Episodes and their summary come from drive/loop/evaluate.py; `--trace DIR` adds the interpretability recorder
(drive/observe/trace.py) to every episode; the results JSON is written atomically.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from pathlib import Path

from datasets.files import atomic_write
from drive.errors import UserError
from drive.loop.options import EvalOptions, policy_spec
from drive.loop.pool import check_ray  # light: Ray itself is imported only for a --ray run
from drive.loop.seeds import parse_seeds
from drive.options import writable_dir, writable_file


@dataclass(frozen=True)
class Config(EvalOptions):
    out: Path | None = None
    """results JSON file (per-episode records and summary); default: print only"""
    trace: Path | None = None
    """ckpt: write each episode's interpretability trace (Parquet + plots) into this directory"""
    data: str | None = None
    """udacity:DIR[,DIR...]: instead of episodes, score the --ckpt controller on every frame of these driving logs
    (offline); --out gets the JSON and beside it a .png of the steering over time"""
    skip_bad_rows: bool = False
    """--data: leave out and count rows naming a missing or corrupt image (default: an error naming the row)"""


def print_table(results: dict, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("seed", "return", "completion", "steps", "off-track", "lap"):
        table.add_column(col, justify="right")
    for r in results["episodes"]:
        table.add_row(
            str(r["seed"]),
            f"{r['return']:.1f}",
            f"{r['completion']:.3f}",
            str(r["steps"]),
            str(r["off_track_events"]),
            "yes" if r["lap_finished"] else "no",
        )
    Console().print(table)
    print(
        f"mean_return {results['mean_return']:.1f} +- {results['std_return']:.1f} (std), "
        f"min_return {results['min_return']:.1f}, max_return {results['max_return']:.1f}, "
        f"{results['laps_finished']}/{results['n_episodes']} laps finished"
    )


def score_recordings(cfg: Config) -> int:
    from drive.learn import recording
    from drive.loop.specs import parse_policy_spec

    kind, path = parse_policy_spec(cfg.policy)
    if kind != "ckpt":
        raise UserError(f"--data scores a trained controller: give --ckpt PATH, not {cfg.policy!r}")
    results, scored = recording.evaluate_recordings(
        path, cfg.data or "", samples=cfg.samples, seed=cfg.seed, skip_bad=cfg.skip_bad_rows, progress=cfg.progress
    )
    print(recording.describe(results))
    if cfg.out is not None:
        plot = recording.plot_recording(scored, Path(cfg.out).with_suffix(".png"), f"{path} on {cfg.data}")
        results["plot"] = str(plot)
        atomic_write(Path(cfg.out), (json.dumps(results, indent=1) + "\n").encode())
        print(f"wrote {cfg.out} and {plot}")
    return 0


def check_before_running(cfg: Config) -> None:
    """What would otherwise fail only after the whole evaluation: the seed lists, a --ray cluster that does not
    answer, and the paths to be written (last: checking them creates their folders)."""
    parse_seeds(cfg.seeds)
    parse_seeds(cfg.calibrate_seeds)
    check_ray(cfg.ray)
    if cfg.out is not None:
        writable_file(cfg.out, "--out")
    if cfg.trace is not None:
        writable_dir(cfg.trace, "--trace")


def run(cfg: Config) -> int:
    # the engine, imported when the command runs: `drive eval --help` must not load torch or the simulator
    from drive.loop.evaluate import describe, evaluate
    from drive.loop.specs import parse_policy_spec
    from drive.observe.trace_recorder import trace_observer
    from drive.observe.uq_plots import plot_eval

    cfg = replace(cfg, policy=policy_spec(cfg.ckpt, cfg.expert and f"expert:{cfg.expert}", "--expert", "expert:ppo"))
    check_before_running(cfg)
    if cfg.data is not None:
        return score_recordings(cfg)
    observers = None if cfg.trace is None else functools.partial(trace_observer, cfg.trace)
    results = evaluate(cfg, observers)
    print_table(results, f"{cfg.policy} on {cfg.env}, seeds {cfg.seeds}")
    if parse_policy_spec(cfg.policy)[0] == "ckpt":
        print(describe(results))
    if cfg.out is not None:
        atomic_write(Path(cfg.out), (json.dumps(results, indent=1) + "\n").encode())
        print(f"wrote {cfg.out}")
        figure = plot_eval(results, Path(cfg.out).with_suffix(".png"))
        if figure is not None:
            print(f"wrote {figure}")
    return 0
