"""The one place a device name becomes a `torch.device` and closed-loop tensors move to and from it.

`drive train --device`, `drive eval --device` and torchrun ranks name a device as text (cpu, cuda, cuda:N, mps).
`resolve` checks it exists on this machine before any work (a missing CUDA is one line, not torch's assertion deep
inside the first `.to()`); `to_device` / `to_host` are what the closed loop calls around a controller's forward, so no
library code calls `.cuda()` or `.cpu()` on its own. Tested on the CPU (tests/drive/test_devices.py): the plumbing,
not a GPU, which no CI machine has.
"""

from __future__ import annotations

import torch

from drive.errors import UserError


def resolve(name: str | torch.device) -> torch.device:
    """A device name -> torch.device, refused (UserError) when this machine has no such device."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UserError(f"--device {name}: not a device name (cpu, cuda, cuda:N, mps)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(
                f"--device {name}: CUDA is not available on this machine (torch {torch.__version__}"
                f"{', a CPU-only build' if torch.version.cuda is None else ''})"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"--device {name}: MPS is not available on this machine")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"--device {name}: unsupported device type {device.type!r} (cpu, cuda, mps)")
    return device


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor onto the controller's device (a no-op on the CPU)."""
    return x if x.device == device else x.to(device, non_blocking=True)


def to_host(x: torch.Tensor) -> torch.Tensor:
    """A result back on the host, for numpy (a no-op on the CPU)."""
    return x if x.device.type == "cpu" else x.cpu()
