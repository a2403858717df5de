"""`drive export`: a trained controller for deployment (ONNX, TorchScript), checked against PyTorch; or a recorded
demonstration dataset as a Minari dataset.

    drive export --ckpt runs/bc-nsac/best.pt --format onnx --out runs/bc-nsac/nsac.onnx             # mean pass
    drive export --ckpt runs/bc-nsac/best.pt --format onnx --samples 32 --out runs/bc-nsac/nsac_s32.onnx
    drive export --table                          # every registered controller x format x pass: what exports
    drive export --data runs/demos --format minari --out runs/minari     # the `minari` extra

The passes and the check are drive/learn/export.py's (inputs `x`, outputs pred_mean, pred_aleatoric_var,
pred_epistemic_var); the Minari layout is drive/learn/minari_export.py's.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from datasets.files import atomic_write
from drive.errors import UserError
from drive.options import NonNegativeInt

if TYPE_CHECKING:  # the exporters and controllers load torch: each function below imports what it runs
    from drive.learn import export


@dataclass(frozen=True)
class Config:
    format: Literal["onnx", "torchscript", "minari"] = "onnx"
    """onnx (checked in onnxruntime), torchscript (torch.jit.trace), or minari (a demonstration dataset, --data)"""
    ckpt: Path | None = None
    """trained controller checkpoint (drive train's best.pt)"""
    out: Path | None = None
    """file written (onnx, torchscript; the table's JSON with --table) or Minari dataset root directory (minari)"""
    samples: NonNegativeInt = 0
    """0: the deterministic mean pass; S > 0: the S-sample predictive (the method's random draws in the graph)"""
    table: bool = False
    """export every registered controller (small random weights) in both formats and passes; print what exports"""
    data: Path | None = None
    """minari: the demonstration dataset directory (drive collect's --out)"""
    dataset_id: str = "drive/carracing/demos-v0"
    """minari: the dataset id (namespace/env/name-vVERSION)"""


def run(cfg: Config) -> int:
    from agents.encoders import EncoderConfig
    from drive import checkpoint
    from drive.learn import export
    from drive.learn.minari_export import export_minari

    if cfg.table:
        return _table(cfg.out)
    if cfg.out is None:
        raise UserError("--out is required")
    if cfg.format == "minari":
        if cfg.data is None:
            raise UserError("--format minari exports a demonstration dataset: give --data DIR")
        path = export_minari(cfg.data, cfg.out, cfg.dataset_id)
        print(f"wrote Minari dataset {cfg.dataset_id} to {path}")
        return 0
    if cfg.ckpt is None:
        raise UserError(f"--format {cfg.format} exports a controller: give --ckpt PATH")
    if cfg.samples < 0:
        raise UserError(f"--samples must be >= 0, got {cfg.samples}")
    model, payload = checkpoint.load_controller(cfg.ckpt)
    encoder = EncoderConfig(**payload["config"]["encoder"])
    pass_ = "samples" if cfg.samples else "mean"
    how = export.export(model, encoder, cfg.format, cfg.out, pass_, cfg.samples or 1)
    result = export.check(model, encoder, cfg.out, cfg.format, pass_, cfg.samples or 1)
    print(f"wrote {cfg.out} ({payload['name']}, {pass_} pass, {cfg.format} via {how}); {_verdict(result)}")
    return 0


def _verdict(c: export.Check) -> str:
    if c.deterministic:
        return f"max |exported - PyTorch| {c.max_abs_diff:.2e} on a batch of 7"
    return f"sampled pass: predictive means {c.mean_gap_se:.2f} standard errors apart on a batch of 7"


def _small(name: str):
    import torch

    from agents.encoders import EncoderConfig
    from agents.registry import CONTROLLERS

    encoder = EncoderConfig(kind="features", in_dim=3, d_model=16)
    if name == "patchtst":
        encoder = EncoderConfig(kind="patches", in_dim=1, n_tokens=32, d_model=16)
    torch.manual_seed(0)
    model = CONTROLLERS[name](encoder=encoder, out_dim=2).build().eval()
    model.set_target_stats(torch.tensor([1.0, -2.0]), torch.tensor([2.0, 0.5]))  # the folded-in units are checked
    return model, encoder


def _cell(model, encoder, fmt: str, pass_: str, where: Path) -> dict:
    from drive.learn import export

    path = where / f"model.{fmt}"
    try:
        how = export.export(model, encoder, fmt, path, pass_, 16)
    except export.ExportError as exc:
        return {"exports": False, "why": str(exc)}
    c = export.check(model, encoder, path, fmt, pass_, 16)
    return {"exports": True, "exporter": how, **c._asdict()}


def _table(out: Path | None) -> int:
    from agents.registry import CONTROLLERS
    from drive.learn import export

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in CONTROLLERS:
            model, encoder = _small(name)
            rows[name] = {
                f"{fmt}/{p}": _cell(model, encoder, fmt, p, Path(tmp)) for fmt in export.FORMATS for p in export.PASSES
            }
    print(
        "| controller | "
        + " | ".join(f"{k} ({'S=16' if k.endswith('samples') else 'mean'})" for k in next(iter(rows.values())))
        + " |"
    )
    print("|---" * 5 + "|")
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(_short_cell(c) for c in cells.values()) + " |")
    if out is not None:
        atomic_write(Path(out), (json.dumps(rows, indent=1) + "\n").encode())
        print(f"wrote {out}")
    return 0


def _short_cell(c: dict) -> str:
    if not c["exports"]:
        return "no: " + c["why"].split(";")[0][:70]
    if c["deterministic"]:
        return f"yes, {c['max_abs_diff']:.1e}"
    return f"yes (sampled), {c['mean_gap_se']:.1f} SE"
