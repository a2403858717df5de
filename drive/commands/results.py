"""`drive results --runs DIR`: the comparison table of every controller trained on the same demonstrations with the
same budget, driven on the same track seeds, beside the expert (`--expert-eval FILE`).

Layout read (written by `drive train --out DIR/<controller>` and `drive eval --out DIR/<controller>/eval.json`):

    DIR/<controller>/metrics.json   offline metrics on held-out demonstration episodes ("test" split) of best.pt
    DIR/<controller>/eval.json      closed-loop evaluation with the shadow expert (mean_return, coverage90_steer, ...)

With `--checkpoint last` (a fixed training budget: every controller's last epoch drives), the offline metrics are
those of last.pt, computed on the same test episodes (the split rebuilt from its data fingerprint) and cached in
DIR/<controller>/offline_last.json; eval.json must then come from last.pt too.

Columns: closed-loop return (mean +- std, min, and as a share of the expert's mean), laps finished, the shadow expert's
steering coverage by the controller's 50 % / 90 % intervals and the NLL of its action (on-policy calibration), the
controller's step latency, and the offline test metrics (MSE, NLL, CRPS, ECE, 90 % coverage) over the three actions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from drive import fields
from drive.errors import UserError
from drive.options import writable_file

ORDER = tuple(fields.registry("agents.registry", "CONTROLLERS"))  # the registry's order, read without torch


@dataclass(frozen=True)
class Config:
    runs: Path
    """directory holding one run directory per controller (nsac, gmle, mcd, de, der, sdenet)"""
    expert_eval: Path | None = None
    """`drive eval --expert ppo --out` JSON on the same seeds (the reference return)"""
    out: Path | None = None
    """also write the table (markdown) here"""
    checkpoint: Literal["best", "last"] = "best"
    """which checkpoint the table describes: best (lowest validation NLL, drive train's report) or last"""


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def offline(run: Path, checkpoint: str) -> dict:
    """The offline test metrics of RUN/<checkpoint>.pt."""
    if checkpoint == "best":
        return ((_load(run / "metrics.json") or {}).get("test")) or {}
    cache = run / f"offline_{checkpoint}.json"
    if not cache.is_file():
        from drive import checkpoint as ckpt  # torch: loaded when a table is made, not for --help
        from drive.learn import tasks

        model, payload = ckpt.load_controller(run / f"{checkpoint}.pt")
        cache.write_text(json.dumps(tasks.rebuild(payload.get("data", {})).evaluate(model).get("test", {}), indent=1))
    return json.loads(cache.read_text())


def run_names(runs: Path) -> list[str]:
    """The run folders of RUNS (those holding metrics.json or eval.json): the registry's order, then the others."""
    found = {p.name for p in runs.iterdir() if (p / "metrics.json").is_file() or (p / "eval.json").is_file()}
    return [n for n in ORDER if n in found] + sorted(found - set(ORDER))


def check_before_running(cfg: Config) -> None:
    """Every input and output path, before anything is read in earnest or computed."""
    if not cfg.runs.is_dir():
        raise UserError(f"--runs {cfg.runs}: no such folder")
    if not run_names(cfg.runs):
        raise UserError(
            f"--runs {cfg.runs}: no runs in this folder; a run is a subfolder RUNS/<controller> holding "
            "metrics.json (drive train --out RUNS/<controller>) or eval.json (drive eval --out "
            "RUNS/<controller>/eval.json)"
        )
    if cfg.expert_eval is not None and not cfg.expert_eval.is_file():
        raise UserError(f"--expert-eval {cfg.expert_eval}: no such file (a `drive eval --out` JSON)")
    if cfg.out is not None:
        writable_file(cfg.out, "--out")


def table(runs: Path, expert_eval: Path | None = None, checkpoint: str = "best") -> str:
    expert = _load(expert_eval) if expert_eval is not None else None
    ref = expert["mean_return"] if expert else None
    head = (
        "| controller | return mean ± std | min | % of expert | laps | cov50 steer | cov90 steer | NLL expert | "
        "latency p50/p95 ms | test MSE | test NLL | test CRPS | test ECE | test cov90 | train s |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    if expert:
        lines.append(
            f"| expert ({expert['policy']}) | {expert['mean_return']:.1f} ± {expert['std_return']:.1f} | "
            f"{expert['min_return']:.1f} | 100 % | {expert.get('laps_finished', '-')}/{expert['n_episodes']} |"
            + " - |"
            * 10
        )
    for name in run_names(runs):
        ev, met = _load(runs / name / "eval.json"), _load(runs / name / "metrics.json")
        test = offline(runs / name, checkpoint) if met is not None else {}
        fit = (met or {}).get("fit", {})
        share = None if not (ev and ref) else 100 * ev["mean_return"] / ref
        cells = [
            name,
            "-" if ev is None else f"{ev['mean_return']:.1f} ± {ev['std_return']:.1f}",
            _fmt(ev and ev["min_return"], ".1f"),
            "-" if share is None else f"{share:.0f} %",
            "-" if ev is None else f"{ev.get('laps_finished', 0)}/{ev['n_episodes']}",
            _fmt(ev and ev.get("coverage50_steer"), ".3f"),
            _fmt(ev and ev.get("coverage90_steer"), ".3f"),
            _fmt(ev and ev.get("nll_expert"), ".3f"),
            "-" if not ev or "latency_ms_p50" not in ev else f"{ev['latency_ms_p50']:.2f} / {ev['latency_ms_p95']:.2f}",
            _fmt(test.get("mse"), ".4f"),
            _fmt(test.get("nll"), ".3f"),
            _fmt(test.get("crps"), ".4f"),
            _fmt(test.get("ece"), ".3f"),
            _fmt(test.get("coverage_90"), ".3f"),
            _fmt(fit.get("train_seconds"), ".0f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(cfg: Config) -> int:
    check_before_running(cfg)
    text = table(cfg.runs, cfg.expert_eval, cfg.checkpoint)
    print(text)
    if cfg.out is not None:
        Path(cfg.out).write_text(text + "\n")
        print(f"wrote {cfg.out}")
    return 0
