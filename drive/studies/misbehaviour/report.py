"""The misbehaviour benchmark's tables: prediction on the field's protocol per monitor, prevention and its cost.

Prediction (drive/studies/misbehaviour/protocol.py): per controller and monitor, nominal-condition episodes give the
false-positive windows and the threshold (Gamma fit at each confidence level; by default fitted on one half of them
and counted on the other); shifted episodes give one window per misbehaviour at each TTM. Shifted conditions are
grouped by family: `held_out` (families no method trained on: the headline), `surrogate` (the families NSAC's
training surrogate draws from: additive pixel noise and a gain, i.e. `noise` and `brightness`; reported apart, never
in the headline) and each family alone. held_out and surrogate are pooled over families, each family weighted
equally (protocol.py, pooling): each misbehaving shifted episode weighs (the group's misbehaving episodes / its
families) / its family's, so a family with more misbehaving episodes counts no more; the nominal windows weigh 1.
Each group's table records it ("weighting") and per family its misbehaving episodes, their weight and the windows
scored at each TTM ("families"). Nominal-condition episodes that do misbehave stay in, their misbehaviours
and the 3 s before each left out of the false-positive windows; they are counted. Where the protocol scored is not
the field's (`protocol.FIELD`), each monitor's row at the plan's level and TTM under the field's rules is kept
beside ours (`field`), so the report shows both; the field's rules pool episodes (every episode weighs 1: their
code scores one simulation at a time and says nothing on pooling).

Prevention (cells with the fallback engaged when the declared monitor reaches its nominal threshold at the chosen
level; one set of cells per fallback mode: `slow`, nothing privileged, the headline, and `expert`, the PPO expert
driving from privileged state, an oracle bound), per condition, paired by seed with the ungated cell: misbehaviours
without and with the fallback and the share prevented; per episode, the share of misbehaving episodes that drive
without one when gated; mean return without and with it; and the false-alarm cost: interventions per km and the
share of steps handed over, on nominal runs and on benign shifts (episodes of shifted conditions in which the
ungated controller drove without a misbehaviour). A stall that begins while the gate is engaged is the slow mode
doing its job — the car stopped rather than leaving the road — so it is counted as a safe stop, not a misbehaviour.
Episodes whose first ungated misbehaviour comes before their first scorable window (warm-up + TTM) failed too early
to be predicted: counted apart and left out of the per-episode share. Distance: visited tiles x CarRacing's
TRACK_DETAIL_STEP (3.5 m). Every figure carries a 95 % bootstrap interval over episodes.
Over training seeds: drive/studies/misbehaviour/seeds.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from drive import metrics
from drive.loop.failures import SIGNALS
from drive.studies.misbehaviour import nulls, protocol
from drive.studies.misbehaviour.rows import pick

NOMINAL = "nominal"  # the clean-camera condition of every controller
TILE_M = 21 / 6.0  # gymnasium car_racing.py TRACK_DETAIL_STEP: one road tile, in metres
PUBLISHED = [  # the field's own figures, on the Udacity simulator: beside ours, not the same setting
    ("SelfOracle (Stocco et al., ICSE 2020)", "predicts 77 % of misbehaviours up to 6 s ahead"),
    ("ThirdEye (Stocco et al., ASE 2022)", "predicts 98 % of misbehaviours up to 3 s ahead"),
    ("MC dropout / deep ensembles (Grewal, Tonella & Stocco, ICST 2024)", "F3 up to 0.94, almost no false alarms"),
    ("DeepGuard (prevention)", "prevents up to 89 % of predicted misbehaviours"),
]


def family(condition: str) -> tuple[str, bool]:
    """(the shift family of a condition spec, whether NSAC's training surrogate draws from it):
    drive/perturb/registry.py `parse_shift` decides both (`escalate:fog:...` -> fog; a user function -> user:...)."""
    from drive.perturb.registry import parse_shift

    shift = parse_shift(condition)
    return shift.family, shift.surrogate_family


def scores_of(episode: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Every monitor's per-step scores of one episode: the controller's own signals, then SelfOracle / ThirdEye; an
    episode that carries `scores` (read from records, or with user monitors: misbehaviour_records.py) gives those."""
    if "scores" in episode:
        return dict(episode["scores"])
    out = {name: np.asarray(episode["signals"])[:, j] for j, name in enumerate(SIGNALS)}
    extra = np.asarray(episode.get("monitor_scores", np.zeros((0, 0))))
    for j, name in enumerate(episode.get("monitor_names", [])):
        out[name] = extra[:, j]
    return out


def _onsets(episode: Mapping[str, Any]) -> list[int]:
    return sorted({int(e["t"]) for e in episode.get("events", [])})


def _families(
    conditions: Sequence[str], families: Mapping[str, tuple[str, bool]] | None = None
) -> dict[str, tuple[str, bool]]:
    known = families or {}
    return {c: known[c] if c in known else family(c) for c in conditions if c != NOMINAL}


def groups(conditions: Sequence[str], families: Mapping[str, tuple[str, bool]] | None = None) -> dict[str, list[str]]:
    """held_out, surrogate and one group per family, each its shifted conditions; `families` ({condition: `family`})
    where known already (records: no need to import a user's shift)."""
    shifted = _families(conditions, families)
    out = {
        "held_out": [c for c, (_, surrogate) in shifted.items() if not surrogate],
        "surrogate": [c for c, (_, surrogate) in shifted.items() if surrogate],
    }
    for c, (name, _) in shifted.items():
        out.setdefault(f"family:{name}", []).append(c)
    return {k: v for k, v in out.items() if v}


def _episode(ep: Mapping[str, Any], monitor: str, nominal: bool, family: str = "") -> protocol.Episode:
    return protocol.Episode(scores_of(ep)[monitor], _onsets(ep), nominal, busy=np.asarray(ep["busy"]), family=family)


WEIGHTING = {"families": "families equal", "episodes": "episodes pooled"}  # a table's "weighting", by cfg.pooling


def _family_counts(
    shifted: Sequence[protocol.Episode], cfg: protocol.ProtocolConfig, ttms: Sequence[int]
) -> dict[str, dict[str, Any]]:
    """{family: {"misbehaving_episodes", "weight" (each episode's, protocol.family_weights), "scored_windows":
    {str(TTM): the windows scored}}} of a group's shifted episodes."""
    weights = protocol.family_weights(shifted, cfg)
    windows = protocol.scored_windows(shifted, ttms, cfg)
    out: dict[str, dict[str, Any]] = {}
    for e, w in zip(shifted, weights, strict=True):
        entry = out.setdefault(e.family, {"misbehaving_episodes": 0, "weight": float(w)})
        entry["misbehaving_episodes"] += 1
        entry["scored_windows"] = windows[e.family]
    return out


def prediction(
    cells: Mapping[str, Mapping[str, Any]],
    cfg: protocol.ProtocolConfig,
    levels: Sequence[float],
    ttms: Sequence[int],
    n_boot: int,
    seed: int,
    *,
    level: float | None = None,
    ttm: int | None = None,
    families: Mapping[str, tuple[str, bool]] | None = None,
) -> dict[str, Any]:
    """{group: {monitor: [row dicts]}} for one controller's ungated cells ({condition: cell}), rows as
    `rows.Row.to_dict` writes them; with the headline's `level` and `ttm`: {group: {"nulls": {monitor: ...}}}, each
    monitor's two null controls through the same pipeline at that level and TTM (drive/studies/misbehaviour/nulls.py),
    and, under a protocol other than the field's, {group: {"field": {monitor: row dict}}}, the field's rules beside
    ours. `families` as `groups` takes them. Each group's shifted episodes are pooled over families, each family
    weighted equally (cfg.pooling; the table's "weighting" says which, "families" gives per family the misbehaving
    episodes, their weight and the windows scored per TTM)."""
    if (level is None) != (ttm is None):
        raise ValueError(f"prediction: the headline needs both a level and a TTM, got {level} and {ttm}")
    headline = level is not None and ttm is not None
    beside = headline and cfg != protocol.FIELD
    nominal_eps = cells[NOMINAL]["episodes"]
    misbehaving = sum(1 for ep in nominal_eps if _onsets(ep))
    out: dict[str, Any] = {"nominal_episodes": len(nominal_eps), "nominal_misbehaving": misbehaving, "groups": {}}
    monitors = list(scores_of(nominal_eps[0])) if nominal_eps else []
    named = _families(list(cells), families)
    for group, conditions in groups(list(cells), named).items():
        shifted = [(ep, named[c][0]) for c in conditions for ep in cells[c]["episodes"] if _onsets(ep)]
        table: dict[str, Any] = {
            "conditions": conditions,
            "misbehaving_episodes": len(shifted),
            "misbehaviours": sum(len(_onsets(ep)) for ep, _ in shifted),
            "weighting": WEIGHTING[cfg.pooling],
            "families": _family_counts([_episode(ep, monitors[0], False, f) for ep, f in shifted], cfg, ttms)
            if monitors
            else {},
            "monitors": {},
        }
        if headline:
            table["nulls"] = {}
        if beside:
            table["field"] = {}
        for monitor in monitors if shifted else ():
            episodes = [_episode(ep, monitor, True) for ep in nominal_eps]
            episodes += [_episode(ep, monitor, False, name) for ep, name in shifted]
            try:
                rows = protocol.evaluate(episodes, cfg, levels, ttms, n_boot, seed)
            except ValueError as exc:  # too few nominal windows (every nominal run misbehaves): nothing to fit on
                table["unscored"] = str(exc)
                break
            table["monitors"][monitor] = [r.to_dict() for r in rows]
            if level is not None and ttm is not None:
                table["nulls"][monitor] = _nulls(episodes, cfg, level, ttm, n_boot, seed)
                if beside:
                    field = protocol.evaluate(episodes, protocol.FIELD, [level], [ttm], n_boot, seed)
                    table["field"][monitor] = pick(field, level, ttm).to_dict()
        out["groups"][group] = table
    return out


def _nulls(
    episodes: Sequence[protocol.Episode], cfg: protocol.ProtocolConfig, level: float, ttm: int, n_boot: int, seed: int
) -> dict[str, Any]:
    """The monitor's null controls at (level, TTM): each null's row and whether the monitor's interval clears them."""
    controlled = nulls.with_nulls(episodes, cfg, [level], [ttm], n_boot, seed)
    flags = controlled.clears[0]
    return {
        **{name: pick(rows, level, ttm).to_dict() for name, rows in controlled.nulls.items()},
        "clears": {"f3": bool(flags.f3), "auroc": bool(flags.auroc)},
    }


def nominal_threshold(
    nominal: Mapping[str, Any],
    level: float,
    cfg: protocol.ProtocolConfig,
    monitor: str = "epistemic_sum",
    seeds: Sequence[int] | None = None,
) -> float:
    """The fallback's threshold: the protocol's threshold on the declared monitor over the nominal runs of `seeds`
    (default: all), fitted on their scored windows (a misbehaving run's misbehaviours and the 3 s before each left
    out). Under scoring `alike` a window's score is its raw per-step maximum, so a gate that fires when the per-step
    score reaches the threshold fires in a 1 s nominal window with probability about 1 - level: its level is a
    per-second false-alarm rate, measured on the nominal seeds not fitted on."""
    episodes = [ep for ep in nominal["episodes"] if seeds is None or ep["seed"] in set(seeds)]
    windows = [protocol.nominal_windows(_episode(ep, monitor, True), cfg)[0] for ep in episodes]
    values = np.concatenate(windows) if windows else np.zeros(0)
    if len(values) < 2:
        bad = sum(1 for ep in episodes if _onsets(ep))
        raise ValueError(
            f"too few nominal windows to fit the fallback threshold ({bad} of the {len(episodes)} "
            "nominal runs it is fitted on misbehave): give more --nominal-seeds"
        )
    return float(protocol.fit_threshold(values, [level], cfg.threshold_fit)[0])


def budget_threshold(
    nominal: Mapping[str, Any], per_km: float, monitor: str = "epistemic_sum", seeds: Sequence[int] | None = None
) -> float:
    """The fallback's threshold for a stated false-alarm budget: the lowest per-step score at which the gate
    (drive/loop/fallback.py `FallbackGate`, its hysteresis included) replayed on the raw per-step scores of the
    nominal runs of `seeds` engages at most `per_km` times per km they drove (visited tiles x 3.5 m). Every step
    counts, the reset's zoom-in and a misbehaving run's too: the live gate sees them. Replayed on ungated runs, it
    counts the engagements a gate would make on the same drive; the gated nominal runs on the other seeds measure it."""
    from drive.loop.fallback import FallbackGate

    episodes = [ep for ep in nominal["episodes"] if seeds is None or ep["seed"] in set(seeds)]
    traces = [np.asarray(scores_of(ep)[monitor], float) for ep in episodes]
    km = sum(max(ep.get("tiles", 0), 1) * TILE_M / 1000 for ep in episodes)
    if not traces or not any(len(t) for t in traces):
        raise ValueError("no nominal runs to fit the fallback threshold on: give more --nominal-seeds")

    def engagements(threshold: float) -> int:
        count = 0
        for trace in traces:
            gate = FallbackGate(threshold)
            for value in trace:
                gate.update(float(value))
            count += len(gate.interventions)
        return count

    candidates = np.unique(np.concatenate(traces))
    candidates = candidates[np.isfinite(candidates) & (candidates >= 0)]
    low, high = 0, len(candidates) - 1  # the largest score never engages (the gate needs scores above it)
    while low < high:  # engagements fall as the threshold rises: the first candidate within the budget
        mid = (low + high) // 2
        if engagements(float(candidates[mid])) <= per_km * km:
            high = mid
        else:
            low = mid + 1
    return float(candidates[low])


def _interval(stat: Callable[[np.ndarray], float], n: int, n_boot: int, seed: int) -> dict[str, float]:
    value = stat(np.arange(n))
    if n == 0:
        return {"value": math.nan, "low": math.nan, "high": math.nan}
    low, high = metrics.bootstrap(lambda idx: np.array(stat(idx)), (n,), n_boot, seed)
    return {"value": float(value), "low": float(low), "high": float(high)}


def _safe_stop(event: Mapping[str, Any], gated: Mapping[str, Any]) -> bool:
    """A stall that begins while the gate is engaged: the fallback stopped the car (drive/loop/fallback.py)."""
    t = int(event["t"])
    return event.get("kind") == "stall" and any(
        iv["start"] <= t and (iv.get("end") is None or t <= iv["end"]) for iv in gated.get("interventions", [])
    )


def prevention(
    ungated: Mapping[str, Any], gated: Mapping[str, Any], n_boot: int, seed: int, early_steps: int = 0
) -> dict[str, Any]:
    """One condition's prevention figures, episodes paired by seed (see the module docstring)."""
    plain = {ep["seed"]: ep for ep in ungated["episodes"]}
    pairs = [(plain[ep["seed"]], ep) for ep in gated["episodes"] if ep["seed"] in plain]
    kept = [[e for e in b.get("events", []) if not _safe_stop(e, b)] for _, b in pairs]
    before = np.array([len(_onsets(a)) for a, _ in pairs], float)
    after = np.array([len({int(e["t"]) for e in events}) for events in kept], float)
    safe_stops = sum(len(b.get("events", [])) - len(events) for (_, b), events in zip(pairs, kept, strict=True))
    early = np.array([bool(_onsets(a)) and _onsets(a)[0] < early_steps for a, _ in pairs])
    scorable = (before > 0) & ~early
    ret_a = np.array([a["return"] for a, _ in pairs], float)
    ret_b = np.array([b["return"] for _, b in pairs], float)
    km = np.array([max(b.get("tiles", 0), 1) * TILE_M / 1000 for _, b in pairs])
    interventions = np.array([b.get("n_interventions", 0) for _, b in pairs], float)
    handed = np.array([b.get("fallback_fraction", 0.0) for _, b in pairs], float)
    benign = before == 0

    def ratio(num: np.ndarray, den: np.ndarray) -> Callable[[np.ndarray], float]:
        return lambda idx: float(num[idx].sum() / den[idx].sum()) if den[idx].sum() > 0 else math.nan

    n = len(pairs)
    return {
        "episodes": n,
        "misbehaviours_without": int(before.sum()),
        "misbehaviours_with": int(after.sum()),
        "safe_stops": int(safe_stops),
        "prevented": _interval(
            lambda idx: 1 - ratio(after, before)(idx) if before[idx].sum() else math.nan, n, n_boot, seed
        ),
        "early_episodes": int(early.sum()),
        "misbehaving_episodes": int(scorable.sum()),
        "episodes_prevented": _interval(
            lambda idx: float((after[idx][scorable[idx]] == 0).mean()) if scorable[idx].any() else math.nan,
            n,
            n_boot,
            seed,
        ),
        "return_without": _interval(lambda idx: float(ret_a[idx].mean()), n, n_boot, seed),
        "return_with": _interval(lambda idx: float(ret_b[idx].mean()), n, n_boot, seed),
        "interventions_per_km": _interval(ratio(interventions, km), n, n_boot, seed),
        "benign_episodes": int(benign.sum()),
        "handed_over_benign": _interval(
            lambda idx: float(handed[idx][benign[idx]].mean()) if benign[idx].any() else math.nan, n, n_boot, seed
        ),
    }


def protocol_settings(cfg: protocol.ProtocolConfig) -> dict[str, Any]:
    nominal = "the trailing-mean score" if cfg.scoring == "field" else "the same score"
    split = (
        "fitted on one half of the nominal runs, false positives counted on the other"
        if cfg.threshold_split == "halves"
        else "fitted and counted on the same nominal runs"
    )
    return {
        **asdict(cfg),
        "window_steps": cfg.fps,
        "windows": f"TTM s: frames [onset - TTM*fps, onset - (TTM-1)*fps); nominal: consecutive fps-frame windows "
        f"of {nominal}; a window's score is its {cfg.aggregate}; the first {cfg.warmup_s:g} s of every "
        f"run not scored; thresholds {split}",
    }


def fallbacks(entry: Mapping[str, Any]) -> dict[str, Any]:
    """{mode: its prevention block} of a controller's entry, the headline mode first (results written before there
    were several modes hold one block, `fallback`)."""
    if "fallbacks" in entry:
        return dict(entry["fallbacks"])
    return {entry["fallback"]["mode"]: entry["fallback"]} if entry.get("fallback") else {}
