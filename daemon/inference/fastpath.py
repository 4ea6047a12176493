"""Direct connections' plain steps in native code (``_native.DirectNative``, native/direct.c).

A C client, or client_lib with server-side inference, sends one plain step per message on
its direct connection (a STEP_BATCH of one entry, or a STEP: episode id, reward, a flat
float observation) and waits for the reply; ``DirectConnections`` spent ~40 us of Python
on each. ``FastPath`` holds the native object that does the whole message instead -- read,
split the frame, parse, check, write and publish the lane, and after the serving turn
format and send the reply -- for the connections ``DirectConnections`` hands over while
they are idle (``promote``), and gives each back at the first thing it does not do, with
its bytes untouched (see direct.c).

Only policies whose observation is a 1-D float Box of at most SMALL_BOX_SIZE values
(checked in plain floats against ``Box.small_float_bounds``, as ``columns.to_columns``
does) stored as one float32 lane field, and whose action is Discrete, are stepped
natively; the episodes of others are never handed over. ``maybe`` is None where the
extension is not built, and where direct.c's reply text or grammar disagrees with the Python
codec on the samples of native_agrees.py (checked once per role start; logged). The Python
path (direct.py + front.py) serves every message the native path declines, and is
the oracle of tests/unit/test_direct_native.py. It never runs the network: it writes and
publishes lanes, and the serving turn answers them, so a recurrent policy's plain steps go
this way too (a served step carries no state; the turn feeds each lane's state to the
policy's Step).
"""
from __future__ import annotations

import numpy as np
import structlog

from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.inference.front import Episodes, LanePool
from rlinkd.daemon.inference.native_agrees import disagreement
from rlinkd.daemon.inference.netnative import native_module
from rlinkd.shm.lanes import EVALUATE, OP_STEP, STATUS_OK

LANE_FIELDS = ("req_seq", "resp_seq", "op", "flags", "group_size", "reward", "status", "group",
               "weights_seq_no", "action")
DIRECT_LAYOUT = (*LANE_FIELDS, "obs", "bytes", "capacity", "obs_floats", "action_start", "op_step",
                 "evaluate", "status_ok")
"""The layout tuple ``DirectNative.add_policy`` takes, in order: lane field offsets, then sizes
and constants (direct.c's P_ enum, generated from this: rlinkd.daemon.c_headers)."""
DIRECT_MAX_EPISODES = 16  # episodes one fast direct connection may step (direct.c's cache)
log = structlog.get_logger("inference")


class FastPath:
    """The native plain-step path of one ``DirectConnections`` (see the module docstring)."""

    def __init__(self, pools: dict[str, LanePool], max_message_bytes: int) -> None:
        self.native = native_module().DirectNative(max_message_bytes)
        self.max_episodes: int = native_module().DIRECT_MAX_EPISODES
        self.index: dict[str, int] = {}
        self.pools: list[LanePool] = []
        for name, pool in pools.items():
            bounds = _bounds(pool)
            if bounds is not None:
                self.native.add_policy(len(self.pools), pool.area.lanes, pool.area.requests_array(),
                                       _layout(pool), *bounds)
                self.index[name] = len(self.pools)
                self.pools.append(pool)

    @classmethod
    def maybe(cls, pools: dict[str, LanePool], max_message_bytes: int) -> FastPath | None:
        """A fast path when the extension is built, some policy's spaces allow one and the
        native replies and grammar agree with the codec (native_agrees.py)."""
        if (getattr(native_module(), "DirectNative", None) is None  # (none, or built before direct.c)
                or not any(_bounds(pool) is not None for pool in pools.values())):
            return None
        reason = disagreement(native_module().DirectNative(max_message_bytes))
        if reason is not None:
            log.warning("inference_native_refused", part="direct", reason=reason)
            return None
        return cls(pools, max_message_bytes)

    def steppable(self, eps: Episodes) -> list[tuple[str, int, int, bool]]:
        """The connection's episodes the native path may step: open, started (a step is
        valid), no LOG_RETURNS reward waiting (the native path sends the step's own), of a
        native policy -- (episode_id, policy index, lane, evaluate) each; none when there are
        more than ``max_episodes`` (a connection of many agents sends STEP_BATCHes of many
        entries, which the native path gives back anyway)."""
        index = self.index
        episodes = [(eid, index[ep.policy], ep.lane, ep.evaluate) for eid, ep in eps.open.items()
                    if ep.started and ep.reward == 0.0 and ep.policy in index]
        return episodes if len(episodes) <= self.max_episodes else []

    def published(self, bits: int) -> None:
        """Mark the pools the native path published into (``service``'s bits)."""
        for i, pool in enumerate(self.pools):
            if bits >> i & 1:
                pool.published = True


def _bounds(pool: LanePool) -> tuple[np.ndarray, np.ndarray] | None:
    """(low, high) float64 of a pool the native path can step, else None."""
    obs, act = pool.obs_space, pool.act_space
    if type(obs) is not Box or len(obs.shape) != 1 or type(act) is not Discrete or pool.flat_obs is None:
        return None
    bounds = obs.small_float_bounds
    step = pool.area.layout.step
    if bounds is None or step.action_size != 1 or pool.flat_obs.shape[1:] != obs.shape:
        return None
    return np.array(bounds[0], np.float64), np.array(bounds[1], np.float64)


def _layout(pool: LanePool) -> tuple[int, ...]:
    """The P_ tuple of direct.c: lane field offsets, then sizes and constants."""
    area, dtype = pool.area, pool.area.lanes.dtype
    fields, obs, act = dtype.fields, pool.obs_space, pool.act_space
    assert fields is not None and isinstance(obs, Box) and isinstance(act, Discrete)
    obs_dtype, obs_at = fields["obs"][0], fields["obs"][1]
    assert obs_dtype.fields is not None and obs_dtype.names is not None
    obs_at += obs_dtype.fields[obs_dtype.names[0]][1]
    values = {name: fields[name][1] for name in LANE_FIELDS}
    values.update(obs=obs_at, bytes=dtype.itemsize, capacity=area.capacity, obs_floats=obs.shape[0],
                  action_start=act.start, op_step=OP_STEP, evaluate=EVALUATE, status_ok=STATUS_OK)
    return tuple(values[name] for name in DIRECT_LAYOUT)
