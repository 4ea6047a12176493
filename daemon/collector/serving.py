"""The collector's side of server-side actions: it hands serving connections over and makes
shared-memory clients' lane areas. It never frames, limits or times out a serving message.

A TCP, TLS or Unix-socket connection becomes a serving connection at its first serving
message (``START_EPISODE``, ``GET_ACTION``, ``LOG_RETURNS``, ``END_EPISODE``, ``STEP``,
``STEP_BATCH``, or ``SERVE_DIRECT``, which asks for it before any episode): the collector
stops reading it and passes it to the inference role over the area channel, with the bytes
it had read and not carried out (that message's frame, and whatever the client sent after
it), and forgets it. From then on the role (inference/direct.py) is its one owner: framing,
limits, timeouts, replies. TLS state cannot cross processes, so for a TLS connection the
role gets one end of a socket pair and the collector copies bytes between it and the TLS
stream (``_relay``: no framing, no timers of its own; it ends when either side closes).
docs/serving.md, "Who owns which socket".

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
from dataclasses import dataclass
from typing import Any

import structlog

from rlinkd.client_lib.protocol import codec, serving
from rlinkd.client_lib.protocol.codec import BadMessage
from rlinkd.client_lib.transport import DIRECT_REFUSED
from rlinkd.daemon.collector.channel_outbox import ChannelOutbox
from rlinkd.daemon.collector.core import HandedOver, Session
from rlinkd.daemon.serving import channel
from rlinkd.daemon.serving.deadlines import Deadlines
from rlinkd.daemon.serving.fds import empty_write_buffer, send_fds
from rlinkd.daemon.wiring import Topology
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.lanes import MAX_GROUP, LaneArea, LaneLayout

log = structlog.get_logger("collector")
RELAY_CHUNK_BYTES = 1 << 16


@dataclass
class ServingSession:
    area_id: int = -1          # its shared-memory lane area, if any
    area: LaneArea | None = None
    area_policy: str = ""
    bell_fd: int = -1
    writer: Any = None         # its connection's stream writer (closed if the role refuses the area)


class ServingFront:
    """Built by the collector process; ``handle`` is called from a connection's read loop."""

    def __init__(self, topo: Topology) -> None:
        self.topo, self.cfg = topo, topo.cfg
        self.request_bell = Doorbell(os.dup(topo.request_doorbell.fd))
        self.channel = socket.socket(fileno=os.dup(topo.area_channel[0].fd))
        self.channel.setblocking(False)
        self.outbox = ChannelOutbox(self.channel)
        self.sessions: dict[int, ServingSession] = {}
        self.area_ids = itertools.count(1)
        self.max_episodes = self.cfg.server.max_agents_per_connection
        self.deadlines = Deadlines.of(self.cfg.server)
        self.counts = {"shm_clients": 0, "direct_handed_over": 0, "handover_failed": 0, "tls_relays": 0}

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.channel.fileno(), self.on_channel)
        self._channel_send(channel.ChannelMessage("reset"))

    def stop(self) -> None:
        asyncio.get_running_loop().remove_reader(self.channel.fileno())
        self.outbox.close()

    # ------------------------------------------------------------ dispatch
    async def handle(self, session: Session, msg: codec.Message, body: bytes, reader, writer) -> None:
        """Carry out one serving message: SERVE_ATTACH here; any other hands the connection
        to the inference role (``body``: the message's bytes) and raises HandedOver once the
        collector has nothing more to do with it. If the role cannot take it now the client
        gets a retryable ERROR (``DIRECT_REFUSED``) and the connection closes."""
        state = self.sessions.setdefault(session.id, ServingSession())
        if isinstance(msg, serving.ServeAttach):
            await self._attach(session, state, msg, writer)
            return
        if state.area is not None:
            raise BadMessage(f"{msg.TYPE.value}: this connection serves through its lane area")
        ready = isinstance(msg, serving.ServeDirect)
        first = b"" if ready else codec.frame(body)
        writer.transport.pause_reading()
        await empty_write_buffer(writer, self.deadlines.reply_s)  # (a reply of ours still
        # unsent would otherwise race the role's replies on the socket)
        if writer.get_extra_info("ssl_object") is not None:
            passed = await self._relay(session, first, ready, reader, writer)  # (the relay reads
        else:                                                                   # what reader holds)
            passed = self._pass(writer.get_extra_info("socket").fileno(), first + _unread(reader), ready)
        if not passed:
            writer.write(codec.encode(codec.Error(
                message=f"{DIRECT_REFUSED} the inference role cannot take this connection now")))
        raise HandedOver

    def _pass(self, fd: int, prefix: bytes, ready: bool) -> bool:
        """Send socket ``fd`` (and ``prefix``) to the inference role; False (logged, counted)
        if it cannot go (the outbox's bound of waiting hand-overs, for a stalled role; no
        memory or descriptors)."""
        fds = [fd]
        try:
            if prefix:
                fds.append(channel.prefix_fd(prefix))
            passed = self.outbox.send(channel.ChannelMessage("direct", fds=tuple(fds), ready=ready))
        except OSError as exc:  # (EMFILE, ENOMEM)
            passed = False
            log.warning("serving_hand_over_failed", error=str(exc))
        finally:
            for d in fds[1:]:
                os.close(d)
        self.counts["direct_handed_over" if passed else "handover_failed"] += 1
        return passed

    async def _relay(self, session: Session, prefix: bytes, ready: bool, reader, writer) -> bool:
        """A TLS connection: the role gets one end of a socket pair; bytes are copied both
        ways until either side closes (False: the role could not take it)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            passed = self._pass(theirs.fileno(), prefix, ready)
        finally:
            theirs.close()
        if not passed:
            ours.close()
            return False
        try:
            role_reader, role_writer = await asyncio.open_connection(sock=ours)
        except BaseException:
            ours.close()
            raise
        log.debug("serving_connection_relayed", session=session.id)
        self.counts["tls_relays"] += 1
        writer.transport.resume_reading()
        try:
            await _copy_both_ways(reader, writer, role_reader, role_writer, self.deadlines.reply_s)
        finally:
            self.counts["tls_relays"] -= 1
            role_writer.close()
        return True

    def forget(self, session: Session) -> None:
        """The connection closed: its shared-memory area goes (the role ends its episodes)."""
        state = self.sessions.pop(session.id, None)
        if state is None or state.area is None:
            return
        self._channel_send(channel.ChannelMessage("close", state.area_id))
        state.area.close()
        os.close(state.bell_fd)
        self.counts["shm_clients"] -= 1

    # ------------------------------------------------------------ shared-memory clients
    async def _attach(self, session: Session, state: ServingSession, msg: serving.ServeAttach,
                      writer) -> None:
        if session.transport != "unix":
            raise BadMessage("SERVE_ATTACH is only accepted on the daemon's Unix socket")
        if state.area is not None:
            raise BadMessage("this connection already has a lane area")
        if not 1 <= msg.lanes <= min(self.max_episodes, MAX_GROUP):
            raise BadMessage(f"SERVE_ATTACH: lanes must be 1..{min(self.max_episodes, MAX_GROUP)} "
                             f"(server.max_agents_per_connection={self.max_episodes})")
        policy = msg.policy or self.topo.mapping.policy_for(None)
        if policy not in self.topo.policies:
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
        if not self.outbox.send(msg):
            log.error("area_channel_full", op=msg.op, waiting=len(self.outbox.waiting))

    def status(self) -> dict:
        return dict(self.counts)


def _unread(reader: asyncio.StreamReader) -> bytes:
    """What a StreamReader holds and nobody read yet (asyncio's private buffer, as
    collector/server.py's ``buffered``; reading is paused, so it cannot grow)."""
    return bytes(getattr(reader, "_buffer", b""))


async def _copy_both_ways(client_reader, client_writer, role_reader, role_writer, reply_s: float) -> None:
    """Client -> role until the client's EOF (passed on as a half close); role -> client
    until the role closes (each write to the client taken within ``reply_s``, else the
    relay ends: the role's own timers see nothing of a client that stopped reading). A TLS
    transport closes at the client's EOF, so over TLS a half-closed client gets no more
    replies (a plain socket gets the replies to what it sent)."""
    async def upstream() -> None:
        while data := await client_reader.read(RELAY_CHUNK_BYTES):
            role_writer.write(data)
            await role_writer.drain()
        role_writer.write_eof()
        await asyncio.Event().wait()  # (the role closes when it has answered everything)

    async def downstream() -> None:
        while data := await role_reader.read(RELAY_CHUNK_BYTES):
            client_writer.write(data)
            await asyncio.wait_for(client_writer.drain(), reply_s)

    up, down = asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())
    try:
        await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)
