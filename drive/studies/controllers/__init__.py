"""`drive bench controllers`: grid.py (train every controller, then score them offline and in closed loop) and
text.py (its tables)."""
