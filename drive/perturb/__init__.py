"""Perturbations of the closed loop in one vocabulary and one registry: what the camera sees (camera.py, the
held-out camera families in held_out.py), what the world is (CarRacing's colours, CarRacingExtension's variants) and
what the actuators do (wrappers.py), all named by one grammar (registry.py: `parse_shift`, `shifted_env`)."""
