"""The collector's side of server-side actions (the serving messages of ``protocol.serving``).

TCP (and Unix-socket) action clients: every open episode of a connection holds one lane of
its policy's TCP lane area (a file made by the wiring, at most ``inference.tcp_lanes``). A
request is validated here (episode id known and open, observation inside the space), written
into the lane and published; the inference role answers in the lane and rings the TCP
response doorbell, on which this module resolves the waiting request. A connection has at
most ``server.max_agents_per_connection`` episodes open, each with at most one request in
flight: that bounds what one client can ask; a client that does not read its replies stalls
only its own connection (``server.read_timeout_s`` on the write closes it). Framing and read
timeouts are the collector server's (collector/server.py) until SERVE_DIRECT, the inference
role's (inference/direct.py) after it: docs/serving.md, "Who owns which socket".

Shared-memory action clients (SERVE_ATTACH on the Unix socket): a sealed memfd lane area of
their own plus a response doorbell, handed to the client with the request doorbell, and to
the inference role over the area channel; the requests never touch a socket.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from rlinkd.client_lib.protocol import codec, serving
from rlinkd.client_lib.protocol.codec import BadMessage
from rlinkd.daemon.collector.core import HandedOver, Session
from rlinkd.daemon.collector.ingest import PolicyInfo
from rlinkd.daemon.serving import channel
from rlinkd.daemon.serving.deadlines import Deadlines
from rlinkd.daemon.serving.fds import send_fds
from rlinkd.daemon.serving.front import Episodes, Front, LanePool, Pending
from rlinkd.daemon.wiring import Topology
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.lanes import MAX_GROUP, LaneArea, LaneLayout

log = structlog.get_logger("collector")
ANSWER_TIMEOUT_S = 30.0
SPIN_S = 60e-6


def _spin_until_answered(area: LaneArea, lane: int) -> bool:
    """Busy-wait up to SPIN_S for one answer (only for a lone request: the event loop has
    nothing else waiting on the inference role then)."""
    until = time.perf_counter() + SPIN_S
    while time.perf_counter() < until:
        if area.answered(lane):
            return True
    return False


def _time_out(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(ConnectionError("the inference role did not answer"))


@dataclass
class ServingSession:
    episodes: Episodes = field(default_factory=Episodes)
    area_id: int = -1          # its shared-memory lane area, if any
    area: LaneArea | None = None
    area_policy: str = ""
    bell_fd: int = -1
    writer: Any = None         # its connection's stream writer (closed if the role refuses the area)


class ServingFront:
    """Built by the collector process; ``handle`` is called from a connection's read loop."""

    def __init__(self, topo: Topology, policies: dict[str, PolicyInfo]) -> None:
        self.topo, self.cfg = topo, topo.cfg
        self.pools = {name: self._pool(name, p.tcp_lanes_path, LaneLayout(p.layout), policies[name])
                      for name, p in topo.policies.items()}
        self.front = Front(self.pools, topo.mapping.policy_for, self.cfg.server.max_agents_per_connection,
                           "inference.tcp_lanes")
        self.waiting: dict[str, dict[int, asyncio.Future]] = {name: {} for name in self.pools}
        self.request_bell = Doorbell(os.dup(topo.request_doorbell.fd))
        self.response_bell = Doorbell(os.dup(topo.tcp_response_doorbell.fd))
        self.channel = socket.socket(fileno=os.dup(topo.area_channel[0].fd))
        self.channel.setblocking(False)
        self.sessions: dict[int, ServingSession] = {}
        self.area_ids = itertools.count(1)
        self.max_episodes = self.cfg.server.max_agents_per_connection
        self.deadlines = Deadlines.of(self.cfg.server)
        self.counts = {"tcp_messages": 0, "shm_clients": 0, "direct_handed_over": 0}

    @staticmethod
    def _pool(name: str, path: str, layout: LaneLayout, info: PolicyInfo) -> LanePool:
        area = LaneArea.attach(path, layout)
        area.set_pid("writer", os.getpid())
        return LanePool(area, info.spaces.obs, info.spaces.act, name)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.response_bell.fileno(), self.on_responses)
        loop.add_reader(self.channel.fileno(), self.on_channel)
        self._channel_send(channel.ChannelMessage("reset"))

    def stop(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.response_bell.fileno())
        loop.remove_reader(self.channel.fileno())

    # ------------------------------------------------------------ dispatch
    async def handle(self, session: Session, msg: codec.Message, reader, writer) -> bytes | None:
        """Carry out one serving message; the reply frame (None: no reply)."""
        state = self.sessions.setdefault(session.id, ServingSession())
        self.counts["tcp_messages"] += 1
        if isinstance(msg, serving.ServeAttach):
            await self._attach(session, state, msg, writer)
            return None
        if isinstance(msg, serving.ServeDirect):
            await self._hand_over(session, state, reader, writer)
            raise HandedOver
        outcome = self.front.begin(state.episodes, msg)
        if not isinstance(outcome, Pending):
            return outcome
        for name, idx in outcome.lanes.items():
            await self._answers(self.pools[name], idx)
        return outcome.finish()

    # ------------------------------------------------------------ answers
    async def _answers(self, pool: LanePool, idx: np.ndarray) -> None:
        """Until every lane of a published request (or group) is answered: the role answers
        a group in one pass, so once the first is, the others are within a few stores
        (checked, with a bound: then each is awaited on its own)."""
        await self._answer(pool, int(idx[0]))
        if len(idx) == 1:
            return
        until = time.perf_counter() + SPIN_S
        while not pool.area.answered_all(idx):
            if time.perf_counter() > until:
                await asyncio.gather(*(self._answer(pool, int(lane)) for lane in idx[1:]))
                return

    async def _answer(self, pool: LanePool, lane: int) -> None:
        """Wait for one lane's answer (the role rung first if it sleeps)."""
        waiting = self.waiting[pool.name]
        pool.published = False
        if pool.area.take_server_sleeping():
            self.request_bell.ring()
        elif not waiting and _spin_until_answered(pool.area, lane):
            return  # a lone request to an awake role: no loop turn
        fut = asyncio.get_running_loop().create_future()
        waiting[lane] = fut
        pool.area.announce_client_wait()
        if pool.area.answered(lane):
            self._resolve(waiting, lane)
        timer = asyncio.get_running_loop().call_later(ANSWER_TIMEOUT_S, _time_out, fut)
        try:
            await fut  # (not wait_for: that costs a task and a loop turn per request)
        finally:
            timer.cancel()

    def on_responses(self) -> None:
        """Event-loop reader: the inference role answered some TCP lanes."""
        self.response_bell.drain()
        for pool in self.pools.values():
            self._sweep(pool)
            if self.waiting[pool.name] or pool.busy:
                pool.area.announce_client_wait()
                self._sweep(pool)  # answers that came before the announcement

    def _sweep(self, pool: LanePool) -> None:
        """Resolve answered requests, release drained lanes, free released ones."""
        waiting = self.waiting[pool.name]
        for lane in [lane for lane in waiting if pool.area.answered(lane)]:
            self._resolve(waiting, lane)
        pool.sweep()
        self._kick(pool)

    def _kick(self, pool: LanePool) -> None:
        """After releases were published: ring a sleeping role, ask for the answers' bell."""
        if pool.published:
            pool.published = False
            if pool.area.take_server_sleeping():
                self.request_bell.ring()
            pool.area.announce_client_wait()

    @staticmethod
    def _resolve(waiting: dict[int, asyncio.Future], lane: int) -> None:
        fut = waiting.pop(lane, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def forget(self, session: Session) -> None:
        """The connection closed: release its episodes' lanes (the inference role ends their
        fragments, truncated) and its shared-memory area."""
        state = self.sessions.pop(session.id, None)
        if state is None:
            return
        for ep in state.episodes.open.values():
            self.waiting[ep.policy].pop(ep.lane, None)
        self.front.forget(state.episodes)
        for pool in self.pools.values():
            if pool.busy:
                pool.area.announce_client_wait()
            self._kick(pool)
        if state.area is not None:
            self._channel_send(channel.ChannelMessage("close", state.area_id))
            state.area.close()
            os.close(state.bell_fd)
            self.counts["shm_clients"] -= 1

    # ------------------------------------------------------------ direct connections
    async def _hand_over(self, session: Session, state: ServingSession, reader, writer) -> None:
        """SERVE_DIRECT: stop reading, pass the socket to the inference role over the area
        channel, then SERVE_DIRECT_READY (the client sends nothing before it, so every later
        byte is still in the socket for the role). Refused (BadMessage: ERROR, and the
        connection closes like after any refused request) for TLS, a connection with episodes
        or a lane area, bytes already read after it, or a full channel."""
        if not self.cfg.inference.direct:
            raise BadMessage("SERVE_DIRECT: off on this daemon (inference.direct = false)")
        if writer.get_extra_info("ssl_object") is not None:
            raise BadMessage("SERVE_DIRECT: not on a TLS connection (its session stays in the collector)")
        if state.episodes.open or state.area is not None:
            raise BadMessage("SERVE_DIRECT: only on a connection with no episodes open and no lane area")
        writer.transport.pause_reading()
        # (StreamReader has no public size: bytes after SERVE_DIRECT would be lost to the role)
        if len(getattr(reader, "_buffer", b"")):
            raise BadMessage("SERVE_DIRECT: send nothing after it before SERVE_DIRECT_READY")
        fd = os.dup(writer.get_extra_info("socket").fileno())
        try:
            channel.send(self.channel, channel.ChannelMessage("direct", fds=(fd,)))
        except (BlockingIOError, BrokenPipeError, ConnectionError) as exc:
            raise BadMessage(f"SERVE_DIRECT: the inference role cannot take it now ({exc})") from None
        finally:
            os.close(fd)
        writer.write(codec.encode(serving.ServeDirectReady()))
        if writer.transport.get_write_buffer_size():
            await asyncio.wait_for(writer.drain(), self.deadlines.reply_s)
        self.counts["direct_handed_over"] += 1
        log.debug("serving_connection_handed_over", session=session.id)

    # ------------------------------------------------------------ shared-memory clients
    async def _attach(self, session: Session, state: ServingSession, msg: serving.ServeAttach,
                      writer) -> None:
        if session.transport != "unix":
            raise BadMessage("SERVE_ATTACH is only accepted on the daemon's Unix socket")
        if state.area is not None or state.episodes.open:
            raise BadMessage("this connection already has a lane area or open episodes")
        if not 1 <= msg.lanes <= min(self.max_episodes, MAX_GROUP):
            raise BadMessage(f"SERVE_ATTACH: lanes must be 1..{min(self.max_episodes, MAX_GROUP)} "
                             f"(server.max_agents_per_connection={self.max_episodes})")
        policy = msg.policy or self.topo.mapping.policy_for(None)
        if policy not in self.pools:
            raise BadMessage(f"SERVE_ATTACH: unknown policy {policy!r}")
        p = self.topo.policies[policy]
        name = f"{self.topo.shm_prefix}.serve-{session.id}-{secrets.token_hex(4)}"
        area = LaneArea.create_sealed(name, LaneLayout(p.layout), msg.lanes)
        state.area, state.area_id, state.area_policy = area, next(self.area_ids), policy
        state.writer = writer
        state.bell_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        assert area.segment.fd is not None
        writer.write(codec.encode(serving.ServeAttached(
            name, msg.lanes, area.layout.to_json(), policy, p.obs_space.to_json(), p.act_space.to_json())))
        await send_fds(writer, [area.segment.fd, self.request_bell.fileno(), state.bell_fd],
                       self.deadlines.reply_s)
        self._announce(state)
        self.counts["shm_clients"] += 1
        log.info("shm_action_client_attached", session=session.id, lanes=msg.lanes, policy=policy)

    def _announce(self, state: ServingSession) -> None:
        assert state.area is not None and state.area.segment.fd is not None
        self._channel_send(channel.ChannelMessage("open", state.area_id, state.area_policy,
                                                  state.area.segment.path,
                                                  (state.area.segment.fd, state.bell_fd)))

    def on_channel(self) -> None:
        """Event-loop reader: a (re)started inference role says hello: announce every area."""
        while (msg := channel.receive(self.channel)) is not None:
            for fd in msg.fds:
                os.close(fd)
            if msg.op == "hello":
                for state in self.sessions.values():
                    if state.area is not None:
                        self._announce(state)
            elif msg.op == "refuse":
                self._refused(msg.area_id)

    def _refused(self, area_id: int) -> None:
        """The inference role cannot serve this area (its header was scribbled over, or the
        role has no room): the client's connection is closed (its own fault, or it retries)."""
        for sid, state in self.sessions.items():
            if state.area_id == area_id and state.writer is not None:
                log.warning("shm_action_client_refused", session=sid, area_id=area_id)
                state.writer.close()

    def _channel_send(self, msg: channel.ChannelMessage) -> None:
        try:
            channel.send(self.channel, msg)
        except (BlockingIOError, BrokenPipeError, ConnectionError) as exc:
            log.warning("area_channel_send_failed", op=msg.op, error=str(exc))

    def status(self) -> dict:
        return {**self.counts, "episodes_started": self.front.episodes_started,
                "tcp_episodes_open": sum(len(s.episodes.open) for s in self.sessions.values()),
                "tcp_lanes_free": {name: len(pool.free) for name, pool in self.pools.items()}}
