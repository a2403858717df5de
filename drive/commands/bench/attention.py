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
import math
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import track
from rich.table import Table
from torch import Tensor, nn

from agents.layers.nsac_attention import NSACAttention
from datasets.files import atomic_write
from drive.measure import peak_bytes, time_it
from drive.options import NonNegativeInt, PositiveInt

TARGETS = {"nsac_over_sdpa_at_64": 3.0, "memory_slope_in_n": 1.0, "s32_over_s1": 1.3}


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

    def kernel_step(qkv=qkv):
        for t in qkv:
            t.grad = None
        F.scaled_dot_product_attention(*qkv).square().mean().backward()

    steps = {"nsac": _train_step(nsac, x, lambda m, x: m(x, 1)), "sdpa_block": _train_step(block, x, lambda m, x: m(x)),
             "sdpa_kernel": kernel_step}  # fmt: skip
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
    layers = (NSACAttention(d, h, top_k=cfg.top_k).to(device), NSACAttention(d, h, top_k=None).to(device),
              SDPABlock(d, h).to(device))  # fmt: skip
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
    environment = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads(),
                   "cpu": platform.processor() or platform.machine(),
                   "gpu": torch.cuda.get_device_name(device) if cuda else None}  # fmt: skip
    method = {"time": "median of repeats; ratios from " + ("wall time (synchronised)" if cuda else
                                                           f"process CPU time, {cfg.threads} intra-op thread(s)"),
              "memory": "torch.cuda.max_memory_allocated above the start level" if cuda else METHOD["memory_cpu"],
              "sdpa_block": METHOD["sdpa_block"], "sampling": METHOD["sampling"]}  # fmt: skip
    summary = {
        "nsac_over_sdpa_block_at_64": at64["nsac_over_sdpa_block"] if at64 else None,
        "nsac_over_sdpa_kernel_at_64": at64["nsac_over_sdpa_kernel"] if at64 else None,
        "nsac_memory_loglog_slope": slope,
        "s32_over_s1_pooled": {str(e["n"]): e["pooled_ratio"] for e in sampling},
        "s32_over_s1_pooled_2d": {str(e["n"]): e["pooled_2d_ratio"] for e in sampling},
        "s32_over_s1_floor": {str(e["n"]): e["floor_ratio"] for e in sampling},
        "targets": TARGETS,
    }
    return {"config": {**asdict(cfg), "out": str(cfg.out)}, "environment": environment, "method": method,
            "attention": rows, "sampling": sampling, "summary": summary}  # fmt: skip


def _tables(result: dict) -> list[Table]:
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
            str(r["n"]), cell(r, f"nsac_{unit}_ms"), cell(r, f"sdpa_block_{unit}_ms"),
            cell(r, f"sdpa_kernel_{unit}_ms"), cell(r, "nsac_over_sdpa_block", "{:.2f}x"),
            cell(r, "nsac_over_sdpa_kernel", "{:.1f}x"), cell(r, f"nsac_dense_{unit}_ms"),
        )  # fmt: skip
        memory.add_row(
            str(r["n"]), cell(r, "nsac_peak_mib", "{:.1f}"), cell(r, "sdpa_block_peak_mib", "{:.1f}"),
            cell(r, "sdpa_kernel_peak_mib", "{:.1f}"), cell(r, "nsac_dense_peak_mib", "{:.1f}"),
        )  # fmt: skip
    s = c["samples"]
    sampling = Table(title=f"inference, encoder once: S={s} vs S=1 samples of the NSAC head, {unit} ms")
    for col in ("n", "head", "S=1", f"S={s}", "ratio", f"draws of {s - 1} samples", "floor"):
        sampling.add_column(col, justify="right")
    heads = {"pooled": "pooled, P=2", "pooled_2d": "pooled, P=2d", "tokens": "every token"}
    for r in result["sampling"]:
        for name, label in heads.items():
            first = name == "pooled"  # the draws and their floor are for the pooled head
            sampling.add_row(
                str(r["n"]) if first else "", label, cell(r, f"{name}_s1_{unit}_ms"), cell(r, f"{name}_sS_{unit}_ms"),
                cell(r, f"{name}_ratio", "{:.2f}x"), cell(r, f"draws_{unit}_ms") if first else "",
                cell(r, "floor_ratio", "{:.2f}x") if first else "",
            )  # fmt: skip
    return [timing, memory, sampling]


def run(cfg: Config) -> int:
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
