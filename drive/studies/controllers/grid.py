"""`drive bench controllers`: every controller trained on one dataset at one budget, over several seeds, then driven
and scored the same way; each figure a mean over training seeds with a 95 % interval, differences tested.

Three stages; each unit of work is a file, written atomically and locked while it is made, so a killed run rerun
with the same arguments keeps what finished, and two processes running the same command share the work:
1. Training: the `drive bench offline --task demos` grid (drive/studies/offline/grid.py), one `drive train` run per
(row,
   seed) in OUT/runs/demos/<row>/seed<s>. Every row gets the same data, --epochs and --set (so the same gradient
   steps) and the same selection rule (best.pt by the validation MSE, the demos task's default); training seed s
   also draws the episodes' train / validation / test split, the same split for every row, unless --split-seeds fixes
   one split for every seed (task.split_seed). What each run cost and whether it converged: budget.py.
2. Closed loop: each run's best.pt driven on the unseen --eval-seeds tracks, clean and under each --shifts condition
   (drive/loop/evaluate.py, as `drive eval`; failure prediction off): RUN/closed_loop/<condition>.json.
3. OOD detection: per training seed, `drive ood` over every row's best.pt (they share seed s's test episodes): the
   AUROC of each uncertainty separating clean frames from each --ood family, OUT/ood/seed<s>.json.

`aggregate` turns the files into per-row statistics (drive/studies/over_seeds.py): the mean over seeds, a 95 %
percentile bootstrap interval of it inside the metric's range and, against the reference row, Welch's two-sided p
(uncorrected, `p_vs_reference`); the tables (text.py) star a difference only where p survives Holm's correction over
the comparisons of its table; one not starred is not shown to be real, whatever the means say. Held-out
families (no method trains on them) are averaged into the OOD headline; NSAC's surrogate families (`noise`,
`brightness`: its regulariser trains on them) are reported apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datasets.files import atomic_write
from drive.perturb.registry import parse_shift
from drive.studies.offline import grid as offline
from drive.studies.over_seeds import bounds_of, interval, welch

CLEAN = "clean"
OFFLINE_METRICS = ("mse", "nll", "crps", "ece", "coverage_90")
LOOP_METRICS = ("return", "laps", "coverage90_steer", "nll_expert_steer", "epistemic_var_steer", "latency_ms_p50")
SHIFT_METRICS = ("return", "retained", "laps", "epistemic_ratio")
ALPHA = 0.05


@dataclass(frozen=True)
class Study:
    grid: offline.Grid
    eval_seeds: str
    shifts: tuple[str, ...]
    ood: str  # drive ood --perturb
    ood_episodes: int
    envs: int
    reference: str
    max_episode_steps: int = 1000

    @property
    def conditions(self) -> tuple[str, ...]:
        return (CLEAN, *self.shifts)


def loop_path(cell: offline.Cell, condition: str) -> Path:
    return cell.run_dir / "closed_loop" / f"{condition.replace(':', '_')}.json"


def ood_path(study: Study, seed: int) -> Path:
    return study.grid.out / "ood" / f"seed{seed}.json"


def _trained(cell: offline.Cell) -> bool:
    return (cell.run_dir / "metrics.json").is_file() and (cell.run_dir / "best.pt").is_file()


def drive_cells(study: Study, progress: bool = True) -> int:
    """Every (trained run, condition) not yet driven, driven; returns how many were driven here."""
    from tqdm.auto import tqdm

    from drive.loop.evaluate import evaluate
    from drive.loop.options import EvalOptions

    todo = [
        (c, cond)
        for c in offline.cells(study.grid)
        if _trained(c)
        for cond in study.conditions
        if not loop_path(c, cond).is_file()
    ]
    done = 0
    for cell, condition in tqdm(todo, desc="closed loop", unit="run", disable=not progress, dynamic_ncols=True):
        path = loop_path(cell, condition)
        held = offline.lock(path.parent, path.stem + ".lock")
        if held is None or path.is_file():
            continue
        try:
            opts = EvalOptions(
                policy=f"ckpt:{cell.run_dir / 'best.pt'}",
                seeds=study.eval_seeds,
                progress=False,
                perturb="" if condition == CLEAN else condition,
                failure_horizon=0,
                envs=study.envs,
                max_episode_steps=study.max_episode_steps,
                device=study.grid.device,
            )
            result = evaluate(opts)
            atomic_write(path, (json.dumps(result, indent=1) + "\n").encode())
            done += 1
        finally:
            held.unlink(missing_ok=True)
    return done


def expert_path(study: Study) -> Path:
    return study.grid.out / "expert_clean.json"


def expert_cell(study: Study) -> None:
    """The labelling expert (the dataset's) on the same tracks, clean: the return a clone is measured against."""
    from drive.loop.evaluate import evaluate
    from drive.loop.options import EvalOptions

    path = expert_path(study)
    manifest = json.loads((Path(str(study.grid.data)) / "manifest.json").read_text())
    expert = str(manifest["settings"].get("expert", "pursuit"))
    if path.is_file():
        return
    held = offline.lock(path.parent, path.stem + ".lock")
    if held is None:
        return
    try:
        opts = EvalOptions(
            policy=f"expert:{expert}", seeds=study.eval_seeds, progress=False, max_episode_steps=study.max_episode_steps
        )
        atomic_write(path, (json.dumps(evaluate(opts), indent=1) + "\n").encode())
    finally:
        held.unlink(missing_ok=True)


def _scored(path: Path, runs: list[offline.Cell]) -> bool:
    """The seed's OOD file holds every one of these runs (a row added to the bench later is not in it)."""
    done = _read(path)
    held = {Path(r["ckpt"]) for r in done["controllers"].values()} if done else set()
    return all(c.run_dir / "best.pt" in held for c in runs)


def ood_cells(study: Study) -> int:
    """`drive ood` for every training seed whose rows have all trained and whose result lacks one of them (the
    seed's runs are scored again together: the frames are drawn once per call, and the same seed redraws them)."""
    from drive.studies.ood.study import OODOptions, detect

    done = 0
    for seed in study.grid.seeds:
        runs = [c for c in offline.cells(study.grid) if c.seed == seed]
        path = ood_path(study, seed)
        if not runs or not all(_trained(c) for c in runs) or _scored(path, runs):
            continue
        held = offline.lock(path.parent, path.stem + ".lock")
        if held is None:
            continue
        try:
            detect(
                OODOptions(
                    ckpt=tuple(c.run_dir / "best.pt" for c in runs),
                    out=path,
                    perturb=study.ood,
                    max_episodes=study.ood_episodes,
                    threads=study.grid.threads,
                )
            )
            done += 1
        finally:
            held.unlink(missing_ok=True)
    return done


# -- the report ----------------------------------------------------------------------------------------------------
def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _loop_values(result: dict[str, Any]) -> dict[str, float]:
    n = max(1, int(result["n_episodes"]))
    return {
        "return": result["mean_return"],
        "laps": result["laps_finished"] / n,
        **{k: result.get(k) for k in LOOP_METRICS if k not in ("return", "laps")},
    }


def per_seed(study: Study) -> dict[str, dict[str, dict[int, float]]]:
    """{row: {metric: {seed: value}}} from every finished file."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    oods = {s: _read(ood_path(study, s)) for s in study.grid.seeds}
    families = _families(study)
    for cell in offline.cells(study.grid):
        row = out.setdefault(cell.row, {})
        metrics = _read(cell.run_dir / "metrics.json")
        if metrics is None:
            continue
        for key in OFFLINE_METRICS:
            row.setdefault(f"test {key}", {})[cell.seed] = metrics["test"].get(key)
        row.setdefault("train s", {})[cell.seed] = metrics["fit"]["train_seconds"]
        clean = _read(loop_path(cell, CLEAN))
        if clean is not None:
            for key, value in _loop_values(clean).items():
                row.setdefault(f"{CLEAN} {key}", {})[cell.seed] = value
        for shift in study.shifts:
            shifted = _read(loop_path(cell, shift))
            if shifted is None:
                continue
            values = _loop_values(shifted)
            for key in ("return", "laps"):
                row.setdefault(f"{shift} {key}", {})[cell.seed] = values[key]
            if clean is not None:
                base = _loop_values(clean)
                row.setdefault(f"{shift} retained", {})[cell.seed] = values["return"] / base["return"]
                if base["epistemic_var_steer"]:
                    ratio = values["epistemic_var_steer"] / base["epistemic_var_steer"]
                    row.setdefault(f"{shift} epistemic_ratio", {})[cell.seed] = ratio
        ood = oods.get(cell.seed)
        if ood is not None:
            report = next((r for r in ood["controllers"].values() if Path(r["ckpt"]) == cell.run_dir / "best.pt"), None)
            if report is not None:
                for family in (*families["held_out"], *families["surrogate"]):
                    row.setdefault(f"ood {family}", {})[cell.seed] = report[family]["auroc_epistemic_all"]
                held = [report[f]["auroc_epistemic_all"] for f in families["held_out"]]
                if held:
                    row.setdefault("ood held-out mean", {})[cell.seed] = float(np.mean(held))
    return out


def _families(study: Study) -> dict[str, list[str]]:
    from drive.perturb.camera import parse_perturbations

    names = [str(p) for p in parse_perturbations(study.ood)] if study.ood else []
    surrogate = [n for n in names if parse_shift(n).surrogate_family]
    return {"held_out": [n for n in names if n not in surrogate], "surrogate": surrogate}


def aggregate(study: Study) -> dict[str, Any]:
    """results.json's dict: per row and metric the interval over seeds and Welch's p against the reference row."""
    values = per_seed(study)
    ref = values.get(study.reference, {})
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for row, metrics in values.items():
        rows[row] = {}
        for metric, by_seed in metrics.items():
            entry = interval(list(by_seed.values()), bounds_of(metric))
            if row != study.reference and metric in ref:  # starred only after Holm, over a table's comparisons
                entry["p_vs_reference"] = welch(list(by_seed.values()), list(ref[metric].values()))
            entry["seeds"] = sorted(by_seed)
            rows[row][metric] = entry
    expert = _read(expert_path(study))
    if expert is not None:
        rows[f"expert ({expert['policy'].removeprefix('expert:')})"] = {
            f"{CLEAN} {k}": interval([v]) | {"seeds": []} for k, v in _loop_values(expert).items() if v is not None
        }
    commands = {c.row: c.command for c in offline.cells(study.grid) if c.seed == study.grid.seeds[0]}
    return {
        "reference": study.reference,
        "seeds": list(study.grid.seeds),
        "eval_seeds": study.eval_seeds,
        "shifts": list(study.shifts),
        "ood": _families(study),
        "alpha": ALPHA,
        "rows": rows,
        "train_commands": commands,
    }
