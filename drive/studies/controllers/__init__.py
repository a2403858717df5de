"""`drive bench controllers`: grid.py (train every controller, then score them offline and in closed loop), text.py
(its tables) and budget.py (what each run cost and whether it converged: steps, CPU-s, parameters, learning curves,
and the split's share of the spread)."""
