"""`drive bench closedloop`: the loop's throughput against the env's own. envs.py (env rows), loops.py (collect and
eval rows), ratios.py (ratios and verdicts), controller_calls.py (one controller call for K cars), stages.py and
stage_timers.py (where a step's time goes)."""
