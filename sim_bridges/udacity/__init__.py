"""The Udacity simulator as a gymnasium env over Socket.IO (bridge.py), its transports (server.py,
transport.py, compat.py, protocol.py) and the simulator stand-in that tests and demos drive (standin.py,
sources.py)."""
