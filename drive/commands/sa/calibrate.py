"""`drive sa calibrate --ckpt PATH --out DIR`: choose SA's nu for a trained controller on its validation split and
report its test split without and with SA (drive/learn/sa.py); writes DIR/sa.json (atomically), DIR/sa_curve.png
(L_SA and dispersion against nu) and DIR/sa_controller.pt, the controller with SA engaged at that nu, which every
command taking `--ckpt PATH` drives (`drive eval --ckpt DIR/sa_controller.pt`; agents/sa_controller.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from datasets.files import atomic_write
from drive.learn.options import SAOptions


@dataclass(frozen=True)
class Config(SAOptions):
    out: Path = Path("out/sa")
    """output directory for sa.json, sa_curve.png and sa_controller.pt (the controller with SA at the chosen nu)"""


def _print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from drive.learn.sa import SHOWN

    table = Table(title=f"{result['controller']} test split ({result['n_test']} stacks): without vs with SA")
    for col in ("metric", "without SA", f"SA nu={result['nu']}", "SA + head noise"):
        table.add_column(col, justify="right")
    for key in SHOWN:
        table.add_row(key, *(f"{result['test'][s][key]:.4g}" for s in ("without_sa", "with_sa", "with_sa_plus_head")))
    Console().print(table)
    print(
        f"chosen nu {result['nu']} (bounds {result['nu_bounds']}), {result['n_evals']} evaluations, "
        f"converged {result['converged']}, wall time {result['wall_time_s']:.1f} s on "
        f"{result['n_calibration']} calibration stacks x {result['n_passes']} passes (+{result['encode_s']:.1f} s "
        f"encoding them once); target dispersion {result['target_dispersion']:.4g}, slope {result['slope']:.3f}; "
        f"whole command {result['total_s']:.0f} s"
    )
    if result["at_bound"]:
        print(
            f"note: nu {result['nu']} still sits at the {result['at_bound']} edge of {result['nu_bounds']} after "
            f"{result['n_extensions']} widening(s): a floor, not an optimum"
            + (
                " (nu = 1 is one-hot attention: even the widest resampling spreads the predictions less than their"
                " errors)"
                if result["at_bound"] == "low"
                else ""
            )
        )


def run(cfg: Config) -> int:
    from drive.learn.sa import CONTROLLER_FILE, calibrate, plot_curve, save_controller  # torch: not for `--help`

    cal = calibrate(cfg)
    result = cal.report
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "sa.json", (json.dumps(result, indent=1) + "\n").encode())
    plot_curve(result, out / "sa_curve.png")
    saved = save_controller(cal, out / CONTROLLER_FILE)
    _print_table(result)
    print(f"wrote {out / 'sa.json'}, {out / 'sa_curve.png'} and {saved}; drive it with `drive eval --ckpt {saved}`")
    return 0
