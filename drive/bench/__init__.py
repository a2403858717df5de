"""Benchmarks: scripts that print figures and ratios side by side in one run (never timed unit tests)."""
