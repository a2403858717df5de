"""`drive bench misbehaviour`: protocol.py and windows.py (the field's protocol, windows scored alike,
out-of-sample thresholds, F3), nulls.py (its null controls), grid.py (the plan and the closed-loop prediction /
prevention grid), cells.py (one cell: driven, saved, resumed), monitors.py (SelfOracle / ThirdEye as loop observers),
records.py (the per-step Parquet records and scoring from them), report.py (per-checkpoint figures, the gate's
thresholds), seeds.py (over training seeds), rows.py (typed result rows), text.py and seed_tables.py (the tables),
figures.py (its figures, results.md and the files)."""
