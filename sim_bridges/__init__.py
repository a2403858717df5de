"""Simulators as gymnasium.Env: CarRacing (pixels, privileged state, fast renderer), Udacity (socket.io).

Never imports `drive`, `agents` or `datasets`.
"""
