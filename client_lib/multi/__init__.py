"""Many agents per connection: ``connect_multi`` (agents keyed by id, appearing and leaving at
will, several policies) and ``connect_vector`` (N lockstep copies of one simulator, arrays in
and out). Both need an rlinkd server of protocol 3 or later (SET_CONFIG announces
``max_agents_per_connection``); see docs/python-client.md, "Many agents per connection".
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
                   capacity_records: int | None = None, inference: str = "client",
                   mode: str | None = None, policy: str | None = None):
    """A VectorClient for ``num_envs`` copies (agent ids ``f"{agent_prefix}{i}"``) connected
    to ``address``. ValueError when the server does not support many agents or allows fewer
    than ``num_envs`` per connection.

    ``inference="server"``: a ``ServedVectorClient`` (``client_lib.served_vector``): the
    daemon chooses every copy's action, one round trip per ``act`` for all copies;
    ``mode="evaluate"`` (or ``explore=False``) acts greedily and trains nothing; ``policy``
    names the policy (default: the mapping's); ``seed`` is unused (the daemon draws).
    ``agent_prefix`` and ``capacity_records`` apply to client-side inference only
    (ValueError otherwise)."""
    if inference not in ("client", "server"):
        raise ValueError(f"inference must be 'client' or 'server', not {inference!r}")
    if inference == "server":
        return _served_vector(address, num_envs, token=token, explore=explore, mode=mode,
                              policy=policy, reconnect_timeout_s=reconnect_timeout_s,
                              ssl_context=ssl_context,
                              client_only=(agent_prefix != "env_", capacity_records))
    if mode not in (None, "train") or policy is not None:
        raise ValueError("mode= and policy= apply to inference='server' here "
                         "(client-side vector clients use explore= and the policy mapping)")
    link = open_link(address, token=token, reconnect_timeout_s=reconnect_timeout_s,
                     ssl_context=ssl_context, capacity_records=capacity_records)
    return VectorClient(link, num_envs, agent_prefix=agent_prefix, explore=explore, seed=seed)


def _served_vector(address: str, num_envs: int, *, token: str | None, explore: bool,
                   mode: str | None, policy: str | None, reconnect_timeout_s: float,
                   ssl_context, client_only: tuple):
    from rlinkd.client_lib.served import served_link
    from rlinkd.client_lib.served_vector import ServedVectorClient
    if client_only != (False, None):
        raise ValueError("agent_prefix and capacity_records apply to inference='client'")
    mode = mode or ("train" if explore else "evaluate")
    if mode not in ("train", "evaluate"):
        raise ValueError(f"mode must be 'train' or 'evaluate', not {mode!r}")
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    link = served_link(address, token=token, reconnect_timeout_s=reconnect_timeout_s,
                       ssl_context=ssl_context, policy=policy, lanes=num_envs)
    return ServedVectorClient(link, num_envs, evaluate=mode == "evaluate", policy=policy)


__all__ = ["MultiAgentClient", "MultiAgentUnsupported", "VectorClient", "connect_multi",
           "connect_vector"]
