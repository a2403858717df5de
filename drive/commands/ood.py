"""`drive ood`: offline OOD detection of camera perturbations by each controller's uncertainty
(drive/studies/ood/study.py).

    drive ood --ckpt checkpoints/carracing_nsac.pt runs/c/gmle/best.pt --perturb noise:0.1,domain_randomize \
        --out runs/ood.json

Test frames of each checkpoint's data (its fingerprint's test episodes) against the same steps through a perturbed
camera; AUROC of the epistemic, total and aleatoric variance per controller and perturbation, the JSON written
atomically and the score distributions plotted beside it (FILE.png).
"""

from __future__ import annotations

from dataclasses import dataclass

from drive.studies.ood.study import OODOptions, detect


@dataclass(frozen=True)
class Config(OODOptions):
    pass


def run(cfg: Config) -> int:
    return detect(cfg)
