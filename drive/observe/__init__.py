"""Observers of the closed loop: the trace recorder, plots, the uncertainty overlay, videos."""

FRAME_SIZE = 420  # the overlay's camera view in pixels (a light constant: `drive replay --help` reads it)
