"""Controllers (torch modules with one predictive interface) and experts.

Never imports `drive`, `sim_bridges` or `datasets`: the harness depends on agents, not the other way round.
"""
