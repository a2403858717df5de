"""`drive bench misbehaviour`: protocol.py and windows.py (the field's protocol, windows scored alike,
out-of-sample thresholds, F3), nulls.py (its null controls), grid.py (the closed-loop prediction / prevention grid),
monitors.py (SelfOracle / ThirdEye as loop observers), records.py (the per-step Parquet records and scoring from
them), report.py and text.py (the tables), figures.py (its figures and files)."""
