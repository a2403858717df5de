"""The measurements behind `drive bench attention` (drive/commands/bench/attention.py says what is measured and how):
NSAC attention against torch's scaled_dot_product_attention, time and memory, and the cost of S samples. Kept out
of the command module so that `drive bench attention --help` loads no torch."""

from __future__ import annotations

import math
import platform
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import track
from torch import Tensor, nn

from agents.layers.nsac_attention import NSACAttention
from drive.measure import peak_bytes, time_it

TARGETS = {"nsac_over_sdpa_at_64": 3.0, "memory_slope_in_n": 1.0, "s32_over_s1": 1.3}

Config = Any  # drive.commands.bench.attention.Config (a library module does not import its command)


class SDPABlock(nn.Module):
    """Linear d -> 3d, multi-head scaled_dot_product_attention, Linear d -> 2d: the NSAC layer's interface."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, 2 * d_model)

    def forward(self, x: Tensor) -> Tensor:  # (B, n, d) -> (B, n, 2d)
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4).unbind(0)
        return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))


def _train_step(module: nn.Module, x: Tensor, call: Callable[[nn.Module, Tensor], Tensor]) -> Callable[[], None]:
    def step() -> None:
        module.zero_grad(set_to_none=True)
        x.grad = None
        call(module, x).square().mean().backward()

    return step


@torch.no_grad()
def _sampling(nsac: NSACAttention, tokens: Tensor, readouts: dict, cfg: Config, device: torch.device, key: str) -> dict:
    """S samples vs 1 of the head alone (tokens given: the encoder ran once); pooled = the controller's path."""
    b, n, _ = tokens.shape
    s = cfg.samples
    runs = {}
    for name, readout in readouts.items():
        runs[f"{name}_s1"] = lambda readout=readout: nsac(tokens, 1, readout=readout)
        runs[f"{name}_sS"] = lambda readout=readout: nsac(tokens, s, readout=readout)
    noise = torch.empty(b, nsac.n_heads, s - 1, min(nsac.top_k or n, n), n, device=device)
    runs["draws"] = noise.normal_  # the extra samples' N(0, 1) draws, as the layer makes them
    entry: dict[str, float] = {"n": n}
    for name, fn in runs.items():
        entry[f"{name}_{key}"] = time_it(fn, device, cfg.warmup, cfg.repeats)[key]
    for name in readouts:
        entry[f"{name}_ratio"] = entry[f"{name}_sS_{key}"] / entry[f"{name}_s1_{key}"]
    entry["floor_ratio"] = 1 + entry[f"draws_{key}"] / entry[f"pooled_s1_{key}"]
    return entry


def _row(n: int, layers: tuple, cfg: Config, device: torch.device) -> tuple[dict[str, float], torch.Tensor]:
    """Time and peak memory of one forward+backward of each layer at n tokens; the input it used."""
    nsac, dense, block = layers
    b, d, h = cfg.batch, cfg.d_model, cfg.n_heads
    x = torch.randn(b, n, d, device=device, requires_grad=True)
    qkv = [torch.randn(b, h, n, d // h, device=device, requires_grad=True) for _ in range(3)]

    def kernel_step(qkv: list[Tensor] = qkv) -> None:
        for t in qkv:
            t.grad = None
        q, k, v = qkv
        F.scaled_dot_product_attention(q, k, v).square().mean().backward()

    steps: dict[str, Callable[[], None]] = {
        "nsac": _train_step(nsac, x, lambda m, x: m(x, 1)),
        "sdpa_block": _train_step(block, x, lambda m, x: m(x)),
        "sdpa_kernel": kernel_step,
    }
    if n <= cfg.dense_limit:
        steps["nsac_dense"] = _train_step(dense, x, lambda m, x: m(x, 1))
    row: dict[str, float] = {"n": n}
    for name, step in steps.items():
        timing = time_it(step, device, cfg.warmup, cfg.repeats)
        row[f"{name}_wall_ms"], row[f"{name}_cpu_ms"] = timing["wall_ms"], timing["cpu_ms"]
        row[f"{name}_peak_mib"] = peak_bytes(step, device) / 2**20
    key = "wall_ms" if device.type == "cuda" else "cpu_ms"
    row["nsac_over_sdpa_block"] = row[f"nsac_{key}"] / row[f"sdpa_block_{key}"]
    row["nsac_over_sdpa_kernel"] = row[f"nsac_{key}"] / row[f"sdpa_kernel_{key}"]
    return row, x


METHOD = {
    "memory_cpu": "torch.profiler profile_memory: peak of the CPU allocator's running total of bytes allocated inside "
    "one forward+backward (inputs and weights excluded)",
    "sdpa_block": "Linear d->3d, F.scaled_dot_product_attention, Linear d->2d (same output width as NSAC)",
    "sampling": "torch.no_grad, tokens given (encoder once); pooled: P = 2 readout, pooled_2d: P = 2d readout (the "
    "controller's path), tokens: every token; floor = 1 + time of the extra samples' normal draws alone / pooled S=1",
}


def measure(cfg: Config, console: Console) -> dict:
    device = torch.device(cfg.device)
    torch.manual_seed(cfg.seed)
    d, h = cfg.d_model, cfg.n_heads
    layers = (
        NSACAttention(d, h, top_k=cfg.top_k).to(device),
        NSACAttention(d, h, top_k=None).to(device),
        SDPABlock(d, h).to(device),
    )
    readouts = {  # P = 2 (a 2-D action), P = 2d (the controller's pooled [mu_out ; s_out]), none (every token)
        "pooled": (torch.randn(2, 2 * d, device=device), torch.randn(2, device=device)),
        "pooled_2d": (torch.eye(2 * d, device=device), torch.zeros(2 * d, device=device)),
        "tokens": None,
    }
    rows, sampling = [], []
    key = "wall_ms" if device.type == "cuda" else "cpu_ms"
    for n in track(cfg.tokens, description="bench attention", console=console):
        row, x = _row(n, layers, cfg, device)
        rows.append(row)
        sampling.append(_sampling(layers[0], x.detach(), readouts, cfg, device, key))
    ns = [r["n"] for r in rows]
    logs = [math.log(r["nsac_peak_mib"]) for r in rows]
    slope = (logs[-1] - logs[0]) / (math.log(ns[-1]) - math.log(ns[0])) if len(ns) > 1 else float("nan")
    at64 = next((r for r in rows if r["n"] == 64), None)
    cuda = device.type == "cuda"
    environment = {
        "torch": torch.__version__,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
    }
    method = {
        "time": "median of repeats; ratios from "
        + ("wall time (synchronised)" if cuda else f"process CPU time, {cfg.threads} intra-op thread(s)"),
        "memory": "torch.cuda.max_memory_allocated above the start level" if cuda else METHOD["memory_cpu"],
        "sdpa_block": METHOD["sdpa_block"],
        "sampling": METHOD["sampling"],
    }
    summary = {
        "nsac_over_sdpa_block_at_64": at64["nsac_over_sdpa_block"] if at64 else None,
        "nsac_over_sdpa_kernel_at_64": at64["nsac_over_sdpa_kernel"] if at64 else None,
        "nsac_memory_loglog_slope": slope,
        "s32_over_s1_pooled": {str(e["n"]): e["pooled_ratio"] for e in sampling},
        "s32_over_s1_pooled_2d": {str(e["n"]): e["pooled_2d_ratio"] for e in sampling},
        "s32_over_s1_floor": {str(e["n"]): e["floor_ratio"] for e in sampling},
        "targets": TARGETS,
    }
    return {
        "config": {**asdict(cfg), "out": str(cfg.out)},
        "environment": environment,
        "method": method,
        "attention": rows,
        "sampling": sampling,
        "summary": summary,
    }
