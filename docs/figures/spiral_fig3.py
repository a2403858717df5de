"""The NSAC paper's Figure 3 across runs: aleatoric and epistemic std along the spiral, one line per run.

    .venv/bin/python docs/figures/spiral_fig3.py OUT.png LABEL=RUN_DIR [LABEL=RUN_DIR ...]

Each RUN_DIR is a `drive train --task spiral` run (its best.pt is loaded); the spiral is regenerated from the run's
recorded task options, so train_region=interpolation runs show real extrapolation right of the dotted line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib
import numpy as np
import torch

from datasets.spiral import SpiralRecipe, fourier_features, generate
from drive.checkpoint import load_controller

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def stds(run: Path, seed: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """Aleatoric and epistemic std (steps,) of the run's best checkpoint on the full grid, and n_interp."""
    opts = json.loads((run / "config.json").read_text())["data"]["options"]
    recipe = SpiralRecipe(n_obs=opts["n_obs"], noise_std=opts["noise_std"], seed=opts["data_seed"])
    gen = generate(recipe)
    features = fourier_features(gen.t, float(gen.t[-1]), opts["n_freqs"])  # (steps, F)
    model, _ = load_controller(run / "best.pt")
    with torch.no_grad():
        pred = model.predict(torch.from_numpy(features), None, torch.Generator().manual_seed(seed))
    ale, epi = (np.sqrt(v.numpy().mean(1)) for v in (pred.aleatoric_var, pred.epistemic_var))  # (steps,)
    return ale, epi, recipe.n_interp


def main(out: str, runs: list[str]) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for i, spec in enumerate(runs):
        label, run = spec.split("=", 1)
        ale, epi, n_interp = stds(Path(run))
        ax.plot(epi, color=f"C{i}", label=f"{label}: epistemic std")
        ax.plot(ale, color=f"C{i}", ls=":", lw=0.8, label=f"{label}: aleatoric std")
        inside, outside = slice(None, n_interp), slice(n_interp, None)
        print(f"{label}: epistemic std trained {epi[inside].mean():.2e}, extrapolation {epi[outside].mean():.2e}; "
              f"aleatoric {ale[inside].mean():.2e} / {ale[outside].mean():.2e}")  # fmt: skip
    ax.axvline(n_interp, color="0.5", ls="--", lw=1, label="trained on | extrapolation")
    ax.set(xlabel="time step", ylabel="std (x, y mean)", yscale="log", title="spiral: uncertainty along the curve")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
