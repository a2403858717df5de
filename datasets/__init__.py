"""Loaders: recorded demonstrations, Udacity logs, bearings, forecasting, UCI, spirals; frame preprocessing.

Never imports `drive`, `agents` or `sim_bridges`. Preprocessing shared by training and driving lives here, so the
two can never preprocess differently.
"""
