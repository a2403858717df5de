"""`drive bearings ...`: bearing run-to-failure data (raw vibration snapshots to the published window features)."""
