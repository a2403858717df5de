"""Deployment exports of a trained controller: ONNX (checked in onnxruntime) and TorchScript.

Two passes can be exported, each returning (mean, aleatoric_var, epistemic_var), every one (B, D) in the target's
original units (the checkpoint's standardisation is folded in):

    mean      `Controller.deterministic_pass`: the prediction without the method's own sampling (NSAC: mean
              logits, no OU noise; a deterministic or closed-form method: its prediction; an ensemble: all members).
              Methods whose uncertainty *is* their sampling (MC dropout, SDE-Net, HSA, contextual dropout) have no
              sampling-free pass: theirs draws, so their "mean" export is a sampled one.
    samples   `Controller.predict(x, S)`: the method's S-sample predictive, its random draws inside the graph
              (ONNX RandomNormalLike / RandomUniformLike, fresh each run): statistically, not bitwise, the
              PyTorch pass.

NSAC's CPU kernels (agents/layers/nsac_kernels.py: PairGates and MixKeys, autograd Functions with hand-written
backwards, and the bit-trick top-k) have no exporter support; while exporting they are swapped for the same
forward in plain tensor ops (`traceable`; top-k by torch.topk, which selects the same scores), and the check runs
the real kernels, so any drift between the two shows in the parity figure.

The batch axis is dynamic. ONNX goes through torch's dynamo exporter (torch.export + onnxscript), and where that
fails through the TorchScript-based one (opset 17) with one added symbolic, `expm1` as Exp - 1 (the identity
loses expm1's small-argument precision, about 1e-7 absolute in float32). `check` runs the file in
onnxruntime (or torch.jit.load) against PyTorch on a fresh batch: the largest absolute difference of the three
outputs for a deterministic pass; for a sampled one, the gap between the two predictive means in units of their
Monte-Carlo standard error.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agents.base import Controller
from agents.encoders import EncoderConfig
from agents.layers import nsac_attention, nsac_kernels
from datasets.files import atomic_write
from drive.errors import UserError

log = logging.getLogger(__name__)

FORMATS = ("onnx", "torchscript")
PASSES = ("mean", "samples")
OUTPUTS = ("pred_mean", "pred_aleatoric_var", "pred_epistemic_var")
OPSET = 17
PIXELS = {"frames": (84, 84), "nvidia": (66, 200)}  # encoders of images: (H, W) of one frame


class MeanPass(nn.Module):
    def __init__(self, model: Controller):
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        p = self.model.deterministic_pass(x)  # standardised units
        scale = self.model.y_scale
        return p.mean * scale + self.model.y_loc, p.aleatoric_var * scale**2, p.epistemic_var * scale**2


class SampledPass(nn.Module):
    def __init__(self, model: Controller, samples: int):
        super().__init__()
        self.model, self.samples = model, samples

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        p = self.model.predict(x, self.samples)
        return p.mean, p.aleatoric_var, p.epistemic_var


def example_input(encoder: EncoderConfig, batch: int = 4, seed: int = 0) -> Tensor:
    """A batch the encoder takes: uint8 frame stacks (B, T, 84, 84), YUV images (B, 3, 66, 200) in [0, 255],
    sequences (B, T, F) or feature vectors (B, F)."""
    g = torch.Generator().manual_seed(seed)
    if encoder.kind == "frames":
        return torch.randint(0, 256, (batch, encoder.n_tokens, *PIXELS["frames"]), generator=g, dtype=torch.uint8)
    if encoder.kind == "nvidia":
        return torch.rand(batch, 3 * max(1, encoder.in_dim), *PIXELS["nvidia"], generator=g) * 255
    if encoder.kind in ("sequence", "patches"):
        return torch.randn(batch, encoder.n_tokens, encoder.in_dim, generator=g)
    return torch.randn(batch, encoder.in_dim, generator=g)


def wrap(model: Controller, pass_: str, samples: int) -> nn.Module:
    if pass_ not in PASSES:
        raise UserError(f"pass {pass_!r}: choose one of {PASSES} (drive export: --samples 0 for the mean pass)")
    return (MeanPass(model) if pass_ == "mean" else SampledPass(model, samples)).eval()


def _pair_gates(per_key, per_query, rows, w_c, b_c, w_m, b_m, kappa_min: float, psi_min: float):
    """nsac_kernels.PairGates.forward in plain, out-of-place tensor ops."""
    n_inter, b, h, n = per_query.shape
    if rows is None:  # key k for every query: (I, B, H, n, 1) + (I, B, H, 1, n)
        keys = per_key.view(n_inter, b, n, h).permute(0, 1, 3, 2).unsqueeze(-1)
    else:
        keys = per_key.index_select(1, rows).view(n_inter, b, h, -1, n)  # (I, B, H, K, n)
    pre = keys + per_query.unsqueeze(3)
    shape = pre.shape[1:]
    command = torch.tanh(b_c.unsqueeze(1) + w_c @ torch.tanh(pre).reshape(n_inter, -1))  # (C, pairs)
    z = b_m.unsqueeze(1) + w_m @ command  # (3, pairs)
    return (
        (F.softplus(z[0]) + kappa_min).view(shape),
        torch.tanh(z[1]).view(shape),
        (F.softplus(z[2]) + psi_min).view(shape),
    )


def _mix_keys(alpha: Tensor, values: Tensor, rows: Tensor) -> Tensor:
    """nsac_kernels.MixKeys.forward without the per-slot loop: (F, B, H, S, n)."""
    b, h, s, n_keys, n = alpha.shape
    picked = values.index_select(1, rows.reshape(-1)).view(values.shape[0], n_keys, b, h, 1, n)  # (F, K, B, H, 1, n)
    return (picked * alpha.permute(3, 0, 1, 2, 4).unsqueeze(0)).sum(1)


@contextlib.contextmanager
def traceable() -> Iterator[None]:
    """NSAC's kernels as plain tensor ops while a pass is traced or exported (see the module docstring)."""
    saved = (nsac_kernels.PairGates.apply, nsac_kernels.MixKeys.apply, nsac_attention.top_k_indices)
    nsac_kernels.PairGates.apply = staticmethod(_pair_gates)  # type: ignore[method-assign]
    nsac_kernels.MixKeys.apply = staticmethod(_mix_keys)  # type: ignore[method-assign]
    nsac_attention.top_k_indices = lambda scores, k: scores.topk(k, -1).indices  # type: ignore[assignment]
    try:
        yield
    finally:
        nsac_kernels.PairGates.apply, nsac_kernels.MixKeys.apply, nsac_attention.top_k_indices = saved


def _expm1(g, x):
    return g.op("Sub", g.op("Exp", x), g.op("Constant", value_t=torch.tensor(1.0)))


@contextlib.contextmanager
def _quiet_exporters() -> Iterator[None]:
    """torch.export and the ONNX exporters log every tried decomposition and missing optional package as warnings
    and errors; what matters reaches the caller as an exception."""
    loggers = [logging.getLogger(name) for name in ("torch.export", "torch.onnx", "torch._dynamo", "torch.fx")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _onnx_bytes(module: nn.Module, x: Tensor) -> tuple[bytes, str]:
    """The ONNX model (bytes) and the exporter that made it: dynamo (torch.export), else the TorchScript-based one."""
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module,
                (x,),
                dynamo=True,
                input_names=["x"],
                output_names=list(OUTPUTS),
                verbose=False,
                dynamic_shapes=({0: torch.export.Dim("batch")},),
            )
        return program.model_proto.SerializeToString(), "dynamo"
    except Exception as exc:  # noqa: BLE001 - any exporter failure: try the other exporter, then report both
        first = _short(exc)
        log.info("dynamo ONNX export failed (%s); trying the TorchScript-based exporter", first)
    torch.onnx.register_custom_op_symbolic("aten::expm1", _expm1, OPSET)
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice, every call
            torch.onnx.export(
                module,
                (x,),
                buf,
                dynamo=False,
                opset_version=OPSET,
                input_names=["x"],
                output_names=list(OUTPUTS),
                dynamic_axes={"x": {0: "batch"}},
            )
        return buf.getvalue(), "torchscript-exporter"
    except Exception as second:  # noqa: BLE001
        raise ExportError(f"ONNX export failed: dynamo: {first}; TorchScript-based: {_short(second)}") from None


def _torchscript_bytes(module: nn.Module, x: Tensor) -> tuple[bytes, str]:
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(module, (x,), check_trace=False)
        torch.jit.save(traced, buf)
    except Exception as exc:  # noqa: BLE001
        raise ExportError(f"TorchScript trace failed: {_short(exc)}") from None
    return buf.getvalue(), "torch.jit.trace"


class ExportError(UserError):
    """The controller's pass cannot be exported in this format (an operator or construct the exporter lacks)."""


def _short(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:160] if lines else ''}"


def export(
    model: Controller, encoder: EncoderConfig, fmt: str, out: Path, pass_: str = "mean", samples: int = 32
) -> str:
    """Write the pass in `fmt` to `out` (atomically); returns the exporter used."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: choose one of {FORMATS}")
    if fmt == "onnx":
        require_onnx()
    module = wrap(model.eval(), pass_, samples)
    x = example_input(encoder, batch=2)
    with traceable(), _quiet_exporters():
        data, how = (_onnx_bytes if fmt == "onnx" else _torchscript_bytes)(module, x)
    atomic_write(Path(out), data)
    return how


class Check(NamedTuple):
    deterministic: bool  # the PyTorch pass gives the same output twice
    max_abs_diff: float  # largest |exported - PyTorch| over the three outputs (deterministic passes)
    mean_gap_se: float  # max |mean_exported - mean_torch| / its Monte-Carlo standard error (sampled passes)


def require_onnx() -> None:
    """A UserError saying what to install unless the `export` extra is: torch's ONNX exporters need onnx and
    onnxscript, the check after the export needs onnxruntime. Asked before anything is written."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as exc:
        raise UserError(
            f"--format onnx needs onnx, onnxscript and onnxruntime ({exc.name or 'one'} is missing): "
            "pip install -e '.[export]' (the `export` extra)"
        ) from None


def run_exported(path: Path, fmt: str, x: Tensor) -> list[np.ndarray]:
    if fmt == "onnx":
        require_onnx()
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(list(OUTPUTS), {"x": x.numpy()})
    with torch.no_grad():
        return [t.numpy() for t in torch.jit.load(str(path))(x)]


def check(
    model: Controller,
    encoder: EncoderConfig,
    path: Path,
    fmt: str,
    pass_: str = "mean",
    samples: int = 32,
    seed: int = 1,
) -> Check:
    """The exported file against PyTorch on a fresh batch of 7 (another batch size than the export's)."""
    module = wrap(model.eval(), pass_, samples)
    x = example_input(encoder, batch=7, seed=seed)
    with torch.no_grad():
        ref, again = [t.numpy() for t in module(x)], [t.numpy() for t in module(x)]
    got = run_exported(path, fmt, x)
    deterministic = all(np.array_equal(a, b) for a, b in zip(ref, again, strict=True))
    diff = max(float(np.abs(g - r).max()) for g, r in zip(got, ref, strict=True))
    # sampled: each predictive mean averages n draws with spread sqrt(epistemic var): standard error of the gap
    n = samples if pass_ == "samples" else max(1, getattr(model, "default_samples", 1))
    se = np.sqrt((ref[2] + got[2]) / n) + 1e-12
    gap = float((np.abs(got[0] - ref[0]) / se).max()) if not deterministic else 0.0
    return Check(deterministic, diff, gap)
