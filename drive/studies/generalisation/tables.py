"""results.md of `drive bench generalisation`: the leaderboard with the published rows beside ours, then what the
leaderboard does not show — how the cars left the road, what the gates did before it, whether the controller knew,
the interval over training seeds, and the suite's goal, cell by cell.

Checkpoints whose paths differ only in a `seed<N>` part are one controller (drive/studies/generalisation/suite.py,
`groups`): its episodes are pooled over the seeds (mean ± std over all of them, as the leaderboard reports its 100
episodes), and its mean return gets a 95 % percentile-bootstrap interval over the seeds. Points not (yet) driven
show "–", and the first line says how many are missing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from drive.studies.generalisation.suite import CLEAN, groups, short
from drive.studies.over_seeds import UNIT, cell_text, interval

ATTENTION_AGENT = "AttentionAgent"
SAFE_RETURN = 850.0  # the goal: on each variant >= 850 ungated, or the gate engaged before >= 90 % of misbehaviours
GATE_SHARE = 0.9


def name(key: str) -> str:
    """A controller's label: its seed group's folder (`.../nsac/seed*/best.pt` -> `nsac`), else its file."""
    path = Path(key)
    if "seed*" in path.parts:
        at = path.parts.index("seed*")
        return path.parts[at - 1] if at else key
    return f"{path.parent.name}/{path.name}" if path.name == "best.pt" else path.name


def label(key: str, members: int, gate: str, driven: Sequence[int] = ()) -> str:
    """The row's controller and run; `driven`: per variant, how many of its seeds have the point (an unfinished run
    says how many its cells pool)."""
    seeds = f" ({members} seeds)" if members > 1 else ""
    if driven and min(driven) < members:
        low, high = min(driven), max(driven)
        seeds = f" ({low if low == high else f'{low}-{high}'} of {members} seeds driven so far)"
    if gate == "off":
        return f"{name(key)}{seeds}, ungated"
    return f"{name(key)}{seeds}, gate {gate}" + (" (privileged oracle)" if gate.startswith("expert") else "")


def row(title: str, cells: Sequence[str]) -> str:
    return f"| {title} | " + " | ".join(cells) + " |"


def pooled(grid: Mapping[str, Any], members: Sequence[str], variant: str, gate: str) -> dict[str, Any] | None:
    """One seed group's (variant, gate) point: its members' episodes pooled; None when no member has it."""
    points = [grid[c][variant][gate] for c in members if gate in grid.get(c, {}).get(variant, {})]
    if not points:
        return None
    episodes = [e for p in points for e in p["raw"]] if all("raw" in p for p in points) else None
    returns = np.array([r for p in points for r in p["returns"]], float)
    out: dict[str, Any] = {
        "points": len(points),
        "episodes": len(returns),
        "mean_return": float(returns.mean()),
        "std_return": float(returns.std()),
        "off_track_per_episode": _weighted(points, "off_track_per_episode"),
        "mean_completion": _weighted(points, "mean_completion"),
    }
    if gate != "off":
        failing = sum(int(p["failures_ungated"]) for p in points)
        kept = sum(p["failures_prevented"] * p["failures_ungated"] for p in points if p["failures_ungated"])
        out.update(
            failures_ungated=failing,
            failures_prevented=kept / failing if failing else math.nan,
            handed_over=_weighted(points, "handed_over"),
        )
        if all("engaged_before" in p for p in points):
            before = [p["engaged_before"] for p in points]
            n = sum(int(b["misbehaviours"]) for b in before)
            hits = sum(int(b["engaged"]) for b in before)
            chance = sum(b["null"] * b["misbehaviours"] for b in before if b["misbehaviours"])
            out["engaged_before"] = {
                "misbehaviours": n,
                "engaged": hits,
                "share": hits / n if n else math.nan,
                "null": chance / n if n else math.nan,
            }
    if episodes is not None:
        out["lap_finished"] = float(np.mean([bool(e.get("lap_finished")) for e in episodes]))
    return out


def _weighted(points: Sequence[Mapping[str, Any]], key: str) -> float:
    weights = np.array([p["episodes"] for p in points], float)
    return float(np.average([p[key] for p in points], weights=weights))


def published_mean(cell: str) -> float:
    try:
        return float(cell.split("±")[0].replace("−", "-"))
    except ValueError:
        return math.nan


def tables(results: Mapping[str, Any]) -> list[str]:
    """results.md's lines."""
    suite, grid = results["suite"], results["points"]
    variants, gates = list(suite["variants"]), list(suite["gates"])
    runs = ("off", *gates)
    by_group = groups(list(suite["controllers"]))
    cells = {
        (key, v, g): pooled(grid, members, v, g) for key, members in by_group.items() for v in variants for g in runs
    }
    driven = sum(1 for by in grid.values() for gs in by.values() for _ in gs)
    no_gate = {k.split("|")[0]: v["origin"] for k, v in results.get("thresholds", {}).items() if v["threshold"] is None}
    # a checkpoint whose gate could never fire has its ungated points only
    expected = sum(len(variants) * (1 if c in no_gate else len(runs)) for c in suite["controllers"])
    lines = [f"{driven} of {expected} points driven" + (" (the run is not finished)" if driven < expected else "")]
    for key, members in by_group.items():
        refused = [no_gate[c] for c in members if c in no_gate]
        if refused:
            why = refused[0].split(": ", 2)[-1]  # "no gate: PATH: why" -> why
            lines.append(f"- {name(key)}: no gate ({len(refused)} of {len(members)} checkpoints): {why}")
    head = [row("agent", [short(v) for v in variants]), "|---|" + "---|" * len(variants)]

    def seeds_in(key: str, g: str) -> list[int]:
        """Per variant, how many of the group's checkpoints a cell pools."""
        return [int((cells[(key, v, g)] or {}).get("points", 0)) for v in variants]

    def show(key: str, v: str, g: str, fmt: Any) -> str:
        cell = cells[(key, v, g)]
        return "–" if cell is None else fmt(cell)

    lines += ["", "## Return, mean ± std over episodes", "", *head]
    for agent, published in results["published"].items():
        lines.append(
            row(
                f"{agent} (published: v0, RL / evolution from pixels)", [published.get(short(v), "–") for v in variants]
            )
        )
    for key, members in by_group.items():
        for g in runs:
            if any(cells[(key, v, g)] for v in variants):
                text = [show(key, v, g, lambda c: f"{c['mean_return']:.0f} ± {c['std_return']:.0f}") for v in variants]
                lines.append(row(f"{label(key, len(members), g, seeds_in(key, g))} (ours: v3, cloned)", text))

    lines += ["", "## Over training seeds: mean return [95 % bootstrap interval over the seeds]", "", *head]
    for key, members in by_group.items():
        if len(members) < 2:
            continue
        for g in runs:
            entries = [results["over_seeds"].get(key, {}).get(v, {}).get(g) for v in variants]
            if any(entries):
                lines.append(row(label(key, len(members), g), [cell_text(e) for e in entries]))

    lines += ["", "## Off the road and how far: off-track events per episode / lap completion", "", *head]
    for key, members in by_group.items():
        for g in runs:
            if any(cells[(key, v, g)] for v in variants):
                fmt = lambda c: f"{c['off_track_per_episode']:.2f} / {c['mean_completion']:.2f}"  # noqa: E731
                lines.append(
                    row(label(key, len(members), g, seeds_in(key, g)), [show(key, v, g, fmt) for v in variants])
                )

    lines += [
        "",
        "## The gates before the misbehaviour: of the episodes whose ungated run left the road, the share whose gate "
        "engaged at or before that step (its null: a gate engaging at random at the same rate) / the share the gated "
        "run kept on the road; steps handed over",
        "",
        *head,
    ]
    for key, members in by_group.items():
        for g in gates:
            if any(cells[(key, v, g)] for v in variants):
                lines.append(
                    row(label(key, len(members), g, seeds_in(key, g)), [show(key, v, g, _gate_cell) for v in variants])
                )

    lines += signal_lines(results, by_group, variants)

    goal_gate = gates[0] if gates else None
    lines += [
        "",
        f"## The suite's goal, cell by cell: the ungated mean at or above AttentionAgent's (published); and ≥ "
        f"{SAFE_RETURN:.0f} ungated, or the `{goal_gate}` gate engaged before ≥ {GATE_SHARE:.0%} of the misbehaviours",
        "",
        *head,
    ]
    reference = results["published"].get(ATTENTION_AGENT, {})
    for key, members in by_group.items():
        text = [
            _goal(
                cells[(key, v, "off")],
                cells.get((key, v, goal_gate)),
                reference.get(short(v)),
                "no gate" if all(c in no_gate for c in members) else "not driven yet",
            )
            for v in variants
        ]
        lines.append(row(f"{name(key)} ({len(members)} seeds)" if len(members) > 1 else name(key), text))
    return lines


def signal_lines(
    results: Mapping[str, Any], by_group: Mapping[str, Sequence[str]], variants: Sequence[str]
) -> list[str]:
    """The signal table: per seed group and shifted variant, the mean ratio of its epistemic variance to clean, the
    AUROC against clean with its interval over seeds, and how many seeds clear the shuffled-label null."""
    shifted = [v for v in variants if v != CLEAN]
    lines = [
        "",
        "## Does it know it is lost? Epistemic variance of the steering per episode: ratio to clean; AUROC against "
        "clean [95 % over seeds]; seeds whose AUROC clears its null (the labels shuffled, 97.5 %)",
        "",
        row("controller", [short(v) for v in shifted]),
        "|---|" + "---|" * len(shifted),
    ]
    for key, members in by_group.items():
        text = []
        for v in shifted:
            sig = [results["signal"][c][v] for c in members if v in results["signal"].get(c, {})]
            sig = [s for s in sig if math.isfinite(s["auroc"])]
            if not sig:
                text.append("–")
                continue
            if all(s["mean"] == 0 for s in sig):
                text.append("none: its epistemic variance is 0")
                continue
            auroc = interval([s["auroc"] for s in sig], UNIT)
            ratio = float(np.mean([s["ratio"] for s in sig]))
            text.append(f"{ratio:.2f}x; {cell_text(auroc)}; {sum(s['clears'] for s in sig)} of {len(sig)}")
        lines.append(row(f"{name(key)} ({len(members)} seeds)" if len(members) > 1 else name(key), text))
    return lines


def _gate_cell(cell: Mapping[str, Any]) -> str:
    before = cell.get("engaged_before")
    kept = "–" if not math.isfinite(cell["failures_prevented"]) else f"{cell['failures_prevented']:.0%}"
    if before is None or not before["misbehaviours"]:
        lead = f"{cell['failures_ungated']} left the road"
    else:
        lead = f"{before['engaged']} of {before['misbehaviours']} ({before['share']:.0%}; null {before['null']:.0%})"
    return f"{lead} / {kept}; {cell['handed_over']:.2f}"


def _goal(
    ungated: Mapping[str, Any] | None, gated: Mapping[str, Any] | None, published: str | None, gate: str | None
) -> str:
    """Each half of the goal with its verdict: the ungated mean against AttentionAgent's published mean; safe (≥ 850
    ungated, never off the road, or the gate engaged first on ≥ 90 % of the misbehaviours). `gate`: why there is no
    gated cell ("no gate": it could never fire; "not driven yet"), else None."""
    if ungated is None:
        return "–"
    mean = ungated["mean_return"]
    reference = published_mean(published) if published else math.nan
    versus = "" if not math.isfinite(reference) else f" {'≥' if mean >= reference else '<'} {reference:.0f} "
    beats = "" if not math.isfinite(reference) else ("✓" if mean >= reference else "✗")
    before = (gated or {}).get("engaged_before") or {}
    share = before.get("share", math.nan)
    if mean >= SAFE_RETURN:
        safe = "≥ 850 ✓"
    elif ungated["off_track_per_episode"] == 0:
        safe = "never off the road ✓"
    elif math.isfinite(share):
        safe = f"gate first {share:.0%} " + ("✓" if share >= GATE_SHARE else "✗")
        if gated and gated["points"] < ungated["points"]:
            safe += f" ({gated['points']} of {ungated['points']} seeds so far)"
    else:
        safe = f"{gate or 'gate never engaged first'} ✗" if gated is None or gate else "✗"
    return f"{mean:.0f}{versus}{beats}; {safe}"
