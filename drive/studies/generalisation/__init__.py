"""`drive bench generalisation`: CarRacingExtension's variants (Tang, Nguyen & Ha 2020) beside the published
agents (suite.py)."""
