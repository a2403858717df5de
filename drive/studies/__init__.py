"""studies — benchmark grids beside drive/learn.

A study drives or scores many runs and turns them into a table a reader can rerun: the misbehaviour-prediction
protocol of the field (`protocol`: thresholds fitted on nominal runs, windows at a time to misbehaviour, precision /
recall / FPR / F1 / F3 with bootstrap intervals over episodes). Its modules take plain numpy arrays and know nothing
of torch, of the simulator or of training; the commands feed them what the closed loop recorded.
"""
