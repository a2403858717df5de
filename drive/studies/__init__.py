"""Studies: one folder per benchmark study, each a grid of runs turned into a table a reader can rerun.

misbehaviour/ (prediction and prevention on the field's protocol), closedloop/ (`drive bench closedloop`: the loop's
speed against the env's), controllers/ (`drive bench controllers`), offline/ (`drive bench offline` and its report),
ood/ (`drive ood`), generalisation/ (CarRacingExtension's suite), attention/ (`drive bench attention`), scale/
(`drive bench scale`); over_seeds.py holds the statistics over training seeds that several share. Only commands
import a study (tests/test_layout.py); a study imports the loop, learn, observe and the shared bottom.
"""
