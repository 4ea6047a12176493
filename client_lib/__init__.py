"""client_lib: connect a simulator to rlinkd (or any RLlink server) without torch.

Layers: ``codec`` (sans-IO RLlink), ``transport.RLlinkClient`` (the protocol over a
socket), ``agent`` (``connect``/``act``/``step``/``close`` for simulators that own
their loop), ``multi`` (``connect_multi``/``connect_vector``: many agents per connection)
and ``runner.run_env`` (any gymnasium env, VectorEnv or PettingZoo ParallelEnv). Imports are lazy so that
``import rlinkd.client_lib`` stays cheap.
"""
from __future__ import annotations

__all__ = ["Agent", "MultiAgentClient", "RLlinkClient", "RLlinkError", "ServerError", "VectorClient",
           "connect", "connect_multi", "connect_vector", "run_env"]


def __getattr__(name: str):
    if name in ("connect", "Agent"):
        from rlinkd.client_lib import agent
        return getattr(agent, name)
    if name in ("connect_multi", "connect_vector", "MultiAgentClient", "VectorClient"):
        from rlinkd.client_lib import multi
        return getattr(multi, name)
    if name == "run_env":
        from rlinkd.client_lib.runner import run_env
        return run_env
    if name in ("RLlinkClient", "ServerError", "RLlinkError"):
        from rlinkd.client_lib import transport
        return getattr(transport, name)
    raise AttributeError(name)
