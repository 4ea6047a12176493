"""client_lib: connect a simulator to rlinkd (or any RLlink server) without torch.

Layers: ``codec`` (sans-IO RLlink), ``transport.RLlinkClient`` (the protocol over a
socket), ``agent`` (``connect``/``act``/``step``/``close`` for simulators that own
their loop) and ``runner.run_env`` (any gymnasium env). Imports are lazy so that
``import rlinkd.client_lib`` stays cheap.
"""
from __future__ import annotations

__all__ = ["Agent", "RLlinkClient", "RLlinkError", "ServerError", "connect", "run_env"]


def __getattr__(name: str):
    if name in ("connect", "Agent"):
        from rlinkd.client_lib import agent
        return getattr(agent, name)
    if name == "run_env":
        from rlinkd.client_lib.runner import run_env
        return run_env
    if name in ("RLlinkClient", "ServerError", "RLlinkError"):
        from rlinkd.client_lib import transport
        return getattr(transport, name)
    raise AttributeError(name)
