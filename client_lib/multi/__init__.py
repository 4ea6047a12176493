"""Many agents per connection: ``connect_multi`` (agents keyed by id, appearing and leaving at
will, several policies) and ``connect_vector`` (N lockstep copies of one simulator, arrays in
and out). Both need an rlinkd server of protocol 3 or later (SET_CONFIG announces
``max_agents_per_connection``); see README, "Many agents per connection".
"""
from __future__ import annotations

from rlinkd.client_lib.agent import open_link
from rlinkd.client_lib.multi.book import MultiAgentUnsupported
from rlinkd.client_lib.multi.client import MultiAgentClient
from rlinkd.client_lib.multi.vector import VectorClient


def connect_multi(address: str = "tcp://127.0.0.1:5555", *, token: str | None = None,
                  explore: bool = True, seed: int | None = None,
                  reconnect_timeout_s: float = 120.0, ssl_context=None,
                  capacity_records: int | None = None) -> MultiAgentClient:
    """A MultiAgentClient connected to ``address`` (any address ``client_lib.connect`` takes;
    over shared memory, one ring per policy in use, each of ``capacity_records`` records).
    MultiAgentUnsupported (a ValueError) when the server does not support many agents."""
    link = open_link(address, token=token, reconnect_timeout_s=reconnect_timeout_s,
                     ssl_context=ssl_context, capacity_records=capacity_records)
    return MultiAgentClient(link, explore=explore, seed=seed)


def connect_vector(address: str, num_envs: int, *, agent_prefix: str = "env_",
                   token: str | None = None, explore: bool = True, seed: int | None = None,
                   reconnect_timeout_s: float = 120.0, ssl_context=None,
                   capacity_records: int | None = None) -> VectorClient:
    """A VectorClient for ``num_envs`` copies (agent ids ``f"{agent_prefix}{i}"``) connected
    to ``address``. ValueError when the server does not support many agents or allows fewer
    than ``num_envs`` per connection."""
    link = open_link(address, token=token, reconnect_timeout_s=reconnect_timeout_s,
                     ssl_context=ssl_context, capacity_records=capacity_records)
    return VectorClient(link, num_envs, agent_prefix=agent_prefix, explore=explore, seed=seed)


__all__ = ["MultiAgentClient", "MultiAgentUnsupported", "VectorClient", "connect_multi",
           "connect_vector"]
