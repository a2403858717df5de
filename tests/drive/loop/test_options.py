"""drive/loop/options.py copies two defaults from modules it must not import (they load torch, socket.io): they
stay equal to their source."""

from __future__ import annotations

from drive.loop import options


def test_defaults_copied_into_the_light_options_module_equal_their_source():
    from datasets.frames import DEFAULT_CODING, FRAME_CODINGS
    from sim_bridges.udacity.server import DEFAULT_SERVER
    from sim_bridges.udacity.transport import SERVERS

    assert options.DEFAULT_CODING == DEFAULT_CODING and options.CollectOptions.frame_coding in FRAME_CODINGS
    assert options.DEFAULT_SERVER == DEFAULT_SERVER == options.BridgeOptions.server and DEFAULT_SERVER in SERVERS
    assert options.SHIPPED_CONTROLLER.is_file()
