"""`drive bench attention`: NSAC attention against torch's scaled_dot_product_attention, time and memory, in one run.

At equal batch B, tokens n and width d (H heads), for each n:
- forward + backward time and peak memory of: the NSAC attention layer (top-K, S = 1 sample, output width 2d);
  a standard SDPA block with the same interface (Linear d -> 3d, F.scaled_dot_product_attention, Linear d -> 2d);
  the bare SDPA kernel on (B, H, n, d/H) q, k, v; and, where it fits, NSAC with every key (K = n, dense);
- the cost of S samples versus S = 1 at inference when the encoder runs once: the tokens are given and only the
  attention head samples (the NSAC controller's path: gates once, S logit draws in one op, pooled readout), with a
  P = 2 readout ("pooled"), a P = 2d readout ("pooled 2d": the controller's token-mean of [mu_out ; s_out] before
  its nonlinear heads) and no readout ("tokens": every token's output). Beside them, the time of the (S - 1) B H K n
  standard-normal draws alone (torch's generator, the layer's own call) and the ratio it implies at best,
  floor = 1 + draws / (pooled S = 1): the noise is i.i.d. per logit and sample, so no implementation that draws it
  from the torch generator gets below that floor.
Targets (issue 3): NSAC <= 3x SDPA at n = 64; NSAC memory about linear in n at fixed K; S = 32 <= 1.3x S = 1.

Timing: median over `repeats` runs after `warmup`, both wall-clock and process CPU time; ratios use CPU time on
CPU (one intra-op thread, so CPU time is the work done and does not count time lost to other processes on a
shared machine) and wall time on CUDA (synchronised).
Memory: peak bytes of one forward + backward above what existed before it (drive/measure.py says how).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets.files import atomic_write
from drive.options import NonNegativeInt, PositiveInt


@dataclass(frozen=True)
class Config:
    out: Path
    """results JSON file"""
    batch: PositiveInt = 32
    """batch size B"""
    d_model: PositiveInt = 64
    """token width d"""
    n_heads: PositiveInt = 4
    """attention heads H"""
    top_k: PositiveInt = 8
    """NSAC keys per query K"""
    tokens: tuple[int, ...] = (16, 64, 256)
    """token counts n to measure"""
    samples: PositiveInt = 32
    """stochastic samples S compared with S = 1"""
    repeats: PositiveInt = 10
    """timed runs per measurement (median reported)"""
    warmup: NonNegativeInt = 2
    """untimed runs before timing"""
    threads: PositiveInt = 1
    """torch intra-op threads"""
    device: str = "cpu"
    """cpu or cuda"""
    dense_limit: NonNegativeInt = 64
    """largest n for which NSAC with every key (K = n, quadratic) is also measured"""
    seed: int = 0
    """seed for weights and inputs"""


def _tables(result: dict) -> list[Any]:
    from rich.table import Table

    c, unit = result["config"], "wall" if result["environment"]["device"].startswith("cuda") else "cpu"
    shape = f"B={c['batch']}, d={c['d_model']}, H={c['n_heads']}, K={c['top_k']}"

    def cell(row: dict, key: str, fmt: str = "{:.2f}") -> str:
        return fmt.format(row[key]) if key in row else "-"

    timing = Table(title=f"forward+backward, {unit} ms ({shape})")
    for col in ("n", "NSAC", "SDPA block", "SDPA kernel", "NSAC/block", "NSAC/kernel", "NSAC dense (K=n)"):
        timing.add_column(col, justify="right")
    memory = Table(title="peak memory of one forward+backward, MiB")
    for col in ("n", "NSAC", "SDPA block", "SDPA kernel", "NSAC dense (K=n)"):
        memory.add_column(col, justify="right")
    for r in result["attention"]:
        timing.add_row(
            str(r["n"]),
            cell(r, f"nsac_{unit}_ms"),
            cell(r, f"sdpa_block_{unit}_ms"),
            cell(r, f"sdpa_kernel_{unit}_ms"),
            cell(r, "nsac_over_sdpa_block", "{:.2f}x"),
            cell(r, "nsac_over_sdpa_kernel", "{:.1f}x"),
            cell(r, f"nsac_dense_{unit}_ms"),
        )
        memory.add_row(
            str(r["n"]),
            cell(r, "nsac_peak_mib", "{:.1f}"),
            cell(r, "sdpa_block_peak_mib", "{:.1f}"),
            cell(r, "sdpa_kernel_peak_mib", "{:.1f}"),
            cell(r, "nsac_dense_peak_mib", "{:.1f}"),
        )
    s = c["samples"]
    sampling = Table(title=f"inference, encoder once: S={s} vs S=1 samples of the NSAC head, {unit} ms")
    for col in ("n", "head", "S=1", f"S={s}", "ratio", f"draws of {s - 1} samples", "floor"):
        sampling.add_column(col, justify="right")
    heads = {"pooled": "pooled, P=2", "pooled_2d": "pooled, P=2d", "tokens": "every token"}
    for r in result["sampling"]:
        for name, label in heads.items():
            first = name == "pooled"  # the draws and their floor are for the pooled head
            sampling.add_row(
                str(r["n"]) if first else "",
                label,
                cell(r, f"{name}_s1_{unit}_ms"),
                cell(r, f"{name}_sS_{unit}_ms"),
                cell(r, f"{name}_ratio", "{:.2f}x"),
                cell(r, f"draws_{unit}_ms") if first else "",
                cell(r, "floor_ratio", "{:.2f}x") if first else "",
            )
    return [timing, memory, sampling]


def run(cfg: Config) -> int:
    import torch
    from rich.console import Console

    from drive.studies.attention.cost import measure

    torch.set_num_threads(cfg.threads)
    console = Console()
    result = measure(cfg, console)
    for table in _tables(result):
        console.print(table)
    s = result["summary"]
    if s["nsac_over_sdpa_block_at_64"] is not None:
        console.print(
            f"NSAC / SDPA block at n=64: {s['nsac_over_sdpa_block_at_64']:.2f}x (target <= 3x); "
            f"NSAC / bare SDPA kernel: {s['nsac_over_sdpa_kernel_at_64']:.1f}x"
        )
    console.print(
        f"NSAC peak memory log-log slope in n: {s['nsac_memory_loglog_slope']:.2f} (linear = 1; quadratic = 2)\n"
        f"S={cfg.samples} / S=1 (pooled head): "
        + ", ".join(f"n={n}: {r:.2f}x" for n, r in s["s32_over_s1_pooled"].items())
        + " (target <= 1.3x); pooled 2d: "
        + ", ".join(f"n={n}: {r:.2f}x" for n, r in s["s32_over_s1_pooled_2d"].items())
        + "; floor set by the normal draws alone: "
        + ", ".join(f"n={n}: {r:.2f}x" for n, r in s["s32_over_s1_floor"].items())
        + "\n"
        + f"memory: {result['method']['memory']}"
    )
    atomic_write(cfg.out, json.dumps(result, indent=2).encode())
    console.print(f"wrote {cfg.out}")
    return 0
