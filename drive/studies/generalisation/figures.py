"""The pictures of `drive bench generalisation`: one frame of each variant (DIR/variants.png), and the returns of
every controller per variant beside the published AttentionAgent's, ungated and with each gate (DIR/returns.png):
bars are the mean over all episodes, whiskers the 95 % interval over training seeds (drive/studies/over_seeds.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from drive.studies.generalisation.suite import CLEAN, groups, short
from drive.studies.generalisation.tables import ATTENTION_AGENT, name, pooled, published_mean


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def frames_figure(path: Path, variants: Sequence[str], seed: int = 1000, step: int = 60) -> Path:
    """One frame of each variant (the clean env first), seed `seed` at step `step` of a fixed gentle throttle."""
    plt = _pyplot()
    from drive.loop.envs import make_env
    from drive.perturb.registry import parse_shift, shifted_env

    frames = []
    for variant in variants:
        env = make_env("carracing", max_episode_steps=step + 1)
        env = shifted_env(env, None if variant == CLEAN else parse_shift(variant))
        obs, _ = env.reset(seed=seed)
        for _ in range(step):
            obs, *_ = env.step(np.array([0.0, 0.3, 0.0], np.float32))
        frames.append(np.asarray(obs))
        env.close()
    fig, axes = plt.subplots(1, len(frames), figsize=(2.2 * len(frames), 2.6))
    for ax, frame, variant in zip(np.atleast_1d(axes), frames, variants, strict=True):
        ax.imshow(frame, interpolation="nearest")
        ax.set_title(short(variant), fontsize=10)
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def returns_figure(path: Path, results: Mapping[str, Any]) -> Path:
    """One panel per run (ungated, then each gate): per variant, a bar per controller (its episodes' mean return,
    whiskers its 95 % interval over training seeds) and AttentionAgent's published mean as a black tick."""
    plt = _pyplot()
    suite, grid = results["suite"], results["points"]
    variants, runs = list(suite["variants"]), ["off", *suite["gates"]]
    by_group = groups(list(suite["controllers"]))
    reference = results["published"].get(ATTENTION_AGENT, {})
    fig, axes = plt.subplots(len(runs), 1, figsize=(2.8 + 1.5 * len(variants), 2.6 * len(runs)), squeeze=False)
    width = 0.8 / max(len(by_group), 1)
    for ax, gate in zip(axes[:, 0], runs, strict=True):
        for k, (key, members) in enumerate(by_group.items()):
            x = np.arange(len(variants)) + (k - (len(by_group) - 1) / 2) * width
            cells = [pooled(grid, members, v, gate) for v in variants]
            means = [c["mean_return"] if c else np.nan for c in cells]
            spread = [results["over_seeds"].get(key, {}).get(v, {}).get(gate) for v in variants]
            low = [m - (e["low"] if e and e.get("low") is not None else m) for m, e in zip(means, spread, strict=True)]
            high = [
                (e["high"] if e and e.get("high") is not None else m) - m for m, e in zip(means, spread, strict=True)
            ]
            ax.bar(x, means, width, yerr=[low, high], capsize=2, label=name(key))
        for j, v in enumerate(variants):
            mean = published_mean(reference.get(short(v), "–"))
            ax.hlines(mean, j - 0.45, j + 0.45, colors="black", linewidth=2)
        ax.set_xticks(np.arange(len(variants)), [short(v) for v in variants])
        ax.set_ylabel("return")
        ax.set_title("ungated" if gate == "off" else f"gate {gate}", fontsize=10)
        ax.axhline(0, color="grey", linewidth=0.5)
    axes[0, 0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"return per variant (black: {ATTENTION_AGENT}, published, v0)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
