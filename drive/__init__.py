"""drive: closed-loop autonomous-driving and control harness whose controllers know how sure they are."""

__version__ = "0.1.0"
