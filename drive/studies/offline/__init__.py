"""`drive bench offline`: grid.py (the training grids of every task), results.py (each cell's metrics into
tables), report.py with plots.py, tubes.py and sa_plots.py (DIR/results.md and its figures)."""
