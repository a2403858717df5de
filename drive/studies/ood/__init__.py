"""`drive ood`: scores.py (each controller's uncertainty on test frames and on the same frames through a perturbed
camera), replay.py (recorded episodes replayed through the perturbed camera) and study.py (AUROC per controller and
perturbation, the JSON and its plot)."""
