"""`drive data info DIR`: summarise a recorded demonstration dataset (read from its manifest; --verify reads shards)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import tyro

from drive.loop.seeds import format_seeds

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    dir: Annotated[Path, tyro.conf.Positional]
    """dataset directory written by `drive collect`"""
    verify: bool = False
    """also read every listed shard and check its hash and array shapes"""
    json: bool = False
    """print the summary as JSON instead of a table"""


def dataset_summary(root: str | Path, verify: bool = False) -> dict[str, Any]:
    from datasets.demonstrations import (  # they load torch: imported when a summary is made, not for `--help`
        EPISODE_DIR,
        MANIFEST,
        DemonstrationError,
        check_sizes,
        load_episode,
        read_manifest,
    )
    from datasets.frames import LEGACY_CODING

    root = Path(root)
    manifest = read_manifest(root)
    episodes = manifest["episodes"]
    settings = manifest["settings"]
    usable = [e for e in episodes if not e["flagged"]]
    returns = np.array([e["return"] for e in episodes], dtype=np.float64)
    check_sizes(root, episodes)  # cheap, always: a truncated shard is an error, not a normal table
    listed = {e["file"] for e in episodes}
    on_disk = {f"{EPISODE_DIR}/{p.name}" for p in (root / EPISODE_DIR).glob("seed_*.npz")}

    def stats(values: np.ndarray) -> dict[str, float | None]:
        if not len(values):
            return {"mean": None, "min": None, "max": None}
        return {"mean": float(values.mean()), "min": float(values.min()), "max": float(values.max())}

    summary = {
        "dir": str(root),
        "expert": settings.get("expert"),
        "env": settings.get("env"),
        "action_noise": settings.get("action_noise"),
        "min_return": settings.get("min_return"),
        "keep_raw": settings.get("keep_raw"),
        "frame_coding": settings.get("frame_coding", LEGACY_CODING),
        "max_episode_steps": settings.get("max_episode_steps"),
        "frame_stack": settings.get("frame_stack"),
        "episodes": len(episodes),
        "usable_episodes": len(usable),
        "flagged": len(episodes) - len(usable),
        "flagged_seeds": [e["seed"] for e in episodes if e["flagged"]],
        "frames": int(sum(e["steps"] for e in episodes)),
        "usable_frames": int(sum(e["steps"] for e in usable)),
        "return": stats(returns),
        "usable_return": stats(np.array([e["return"] for e in usable], dtype=np.float64)),
        "completion_mean": float(np.mean([e["completion"] for e in episodes])) if episodes else None,
        "laps_finished": int(sum(bool(e.get("lap_finished")) for e in episodes)),
        "seeds": format_seeds(int(e["seed"]) for e in episodes),
        "bytes": int(sum(e["bytes"] for e in episodes) + (root / MANIFEST).stat().st_size),
        "unlisted_shards": sorted(on_disk - listed),
        "pending_seeds": format_seeds(int(s) for s in manifest.get("pending", [])),
    }
    if verify:  # every listed shard, also of an incomplete dataset: its hash and array shapes
        try:
            frame_stack = int(settings["frame_stack"])
        except (KeyError, TypeError, ValueError):
            raise DemonstrationError(f"{root / MANIFEST}: settings.frame_stack missing or not an int") from None
        for episode in episodes:  # raises DemonstrationError naming the first bad file
            load_episode(root, episode, frame_stack, verify=True)
        summary["verified"] = len(episodes)
    return summary


def _fmt(stats: dict[str, float | None]) -> str:
    if stats["mean"] is None:
        return "-"
    return f"{stats['mean']:.1f} (min {stats['min']:.1f}, max {stats['max']:.1f})"


def run(cfg: Config) -> int:
    from rich.console import Console
    from rich.table import Table

    summary = dataset_summary(cfg.dir, cfg.verify)
    if cfg.json:
        print(json.dumps(summary, indent=1))
        return 0
    table = Table(title=f"demonstrations: {summary['dir']}", show_header=False)
    rows = [
        ("expert", f"{summary['expert']} on {summary['env']}"),
        ("action noise (DART std)", f"{summary['action_noise']}"),
        ("episodes", f"{summary['episodes']} ({summary['usable_episodes']} usable, {summary['flagged']} flagged)"),
        ("flagged seeds", ", ".join(map(str, summary["flagged_seeds"])) or "-"),
        ("frames", f"{summary['frames']} ({summary['usable_frames']} usable)"),
        ("return", _fmt(summary["return"])),
        ("return (usable)", _fmt(summary["usable_return"])),
        ("flag threshold", f"return < {summary['min_return']}"),
        ("completion (mean)", "-" if summary["completion_mean"] is None else f"{summary['completion_mean']:.3f}"),
        ("laps finished", str(summary["laps_finished"])),
        ("seeds", summary["seeds"] or "-"),
        ("frame coding", str(summary["frame_coding"])),
        ("raw frames", "yes" if summary["keep_raw"] else "no"),
        ("size", f"{summary['bytes'] / 1e6:.1f} MB"),
    ]
    if summary["pending_seeds"]:
        rows.append(("INCOMPLETE", f"seeds {summary['pending_seeds']} still to record: rerun the writing command"))
    if summary["unlisted_shards"]:
        rows.append(("unlisted shards (ignored)", ", ".join(summary["unlisted_shards"])))
    if "verified" in summary:
        rows.append(("verified", f"{summary['verified']} shards read, hashes match"))
    for key, value in rows:
        table.add_row(key, value)
    Console().print(table)
    return 0
