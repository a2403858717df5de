"""`drive monitor train --data DIR --out PATH`: train SelfOracle (agents/monitors/selforacle.py), the field's black-box
misbehaviour monitor, on the camera frames of recorded nominal driving.

    drive collect --out runs/demos --seeds 0-59 --action-noise 0.15
    drive monitor train --data runs/demos --out runs/selforacle.pt

The frames are the controller's own coded frames (the newest of each step's stack, every `--stride`-th step) of the
dataset's unflagged episodes: the same demonstrations a controller trains on. The file is a drive checkpoint of kind
"monitor" (the dataset's manifest hash and path in its `data`), read by `drive bench misbehaviour --selforacle PATH`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from drive.options import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt


@dataclass(frozen=True)
class Config:
    data: Path
    """recorded demonstrations (drive collect): their unflagged episodes are the nominal frames"""
    out: Path
    """the monitor checkpoint to write"""
    epochs: PositiveInt = 10
    """training epochs"""
    stride: PositiveInt = 2
    """every stride-th step's frame (neighbouring frames are near duplicates)"""
    latent_dim: PositiveInt = 2
    """VAE latent size (SelfOracle's models: 2)"""
    kl_weight: NonNegativeFloat = 1.0
    """weight of the KL term (their VAE: 1, "50 % rec + 50 % KL"; 0: their MSE-only compile)"""
    lr: PositiveFloat = 1e-3
    """Adam learning rate"""
    batch_size: PositiveInt = 64
    """frames per step"""
    seed: NonNegativeInt = 0
    """shuffling and latent-noise seed"""
    threads: PositiveInt = 1
    """torch CPU threads"""


def run(cfg: Config) -> int:
    import hashlib

    import numpy as np
    import torch

    from agents.monitors.selforacle import SelfOracle, SelfOracleConfig
    from datasets.demonstrations import MANIFEST, Demonstrations
    from datasets.root import portable
    from drive import checkpoint
    from drive.options import writable_file

    writable_file(cfg.out, "--out")
    torch.set_num_threads(cfg.threads)
    data = Demonstrations(cfg.data)
    frames = []
    for seed in data.seeds:
        episode = data.load(seed)
        k = episode.frame_stack
        frames.append(episode.frames[k - 1 :: cfg.stride])  # (T / stride, 84, 84) the newest frame of each stack
    x = torch.as_tensor(np.concatenate(frames))  # (N, 84, 84) uint8
    torch.manual_seed(cfg.seed)
    model = SelfOracle(SelfOracleConfig(latent_dim=cfg.latent_dim, kl_weight=cfg.kl_weight))
    print(f"training SelfOracle on {len(x)} frames of {len(data.seeds)} nominal episodes ({cfg.data})")
    start = time.perf_counter()

    def progress(epoch: int, loss: float) -> None:
        print(f"epoch {epoch}/{cfg.epochs}: loss {loss:.4g} ({time.perf_counter() - start:.0f} s)", flush=True)

    history = model.fit(x, epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed, on_epoch=progress)
    scores = model.score(x).numpy()
    manifest = (Path(cfg.data) / MANIFEST).read_bytes()
    checkpoint.save(
        cfg.out,
        kind="monitor",
        name="selforacle",
        config=model.state()["config"],
        module=model,
        data={
            "path": portable(str(cfg.data)),
            "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
            "n_frames": len(x),
            "stride": cfg.stride,
            "seeds": data.seeds,
        },
        metrics={
            "loss": history,
            "train_score_mean": float(scores.mean()),
            "train_score_p99": float(np.quantile(scores, 0.99)),
        },
        extra={"epochs": cfg.epochs, "lr": cfg.lr, "batch_size": cfg.batch_size, "seed": cfg.seed},
    )
    print(
        f"wrote {cfg.out}: loss {history[0]:.4g} -> {history[-1]:.4g}, training-frame score mean "
        f"{scores.mean():.4g}, p99 {np.quantile(scores, 0.99):.4g}"
    )
    return 0
