"""`drive bench closedloop`: the loop's throughput against the env's own. envs.py (the bare-env rows), loops.py (the
collect and eval rows, divided by them), ratios.py (ratios, round ranges and verdicts), controller_calls.py (one
controller call for K cars), stages.py (where a step's time goes, and the timers that measure it), report.py (what it
prints)."""
