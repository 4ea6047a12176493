"""Event-loop side of shared-memory clients: ATTACH replies, doorbell-driven draining.

ATTACH is answered with the ATTACHED frame and then one byte carrying the client's
sealed ring memfd (SCM_RIGHTS, see ``codec.Attached``); a ring that cannot be made is
refused with ERROR and the connection closed, the collector carries on.

``ShmIngestor`` belongs to the ``CollectorServer``. The doorbell FIFO (in the runtime
directory, 0600) is registered with the event loop; producers write to it only when
the collector has armed the rings' ``reader_sleeping`` flags, so an idle daemon with
silent clients costs nothing, and a write wakes the loop within tens of
microseconds. A slow safety tick also drains, bounding the cost of a lost wake-up.
One drain per client ring at a time (per-session lock): the ring is single-consumer.
"""
from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from pathlib import Path
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

import numpy as np
import structlog

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.client_lib.protocol.codec import ProtocolError
from rlinkd.daemon.collector.pacing import Pacer
from rlinkd.daemon.collector.weights import WeightsCache, exploration_of
from rlinkd.daemon.collector.core import CollectorCore, Session
from rlinkd.daemon.collector.ingest import InvalidEpisode
from rlinkd.daemon.collector.shm_clients import ShmClients
from rlinkd.daemon.config import Config
from rlinkd.daemon.serving.fds import send_fds
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.errors import ShmError
from rlinkd.shm.records import FINAL_OBS
from rlinkd.shm.segment import MEMFD_PATH_PREFIX


log = structlog.get_logger("collector")
DRAIN_CHUNK = 1 << 14
REAP_INTERVAL_S = 1.0  # how often attaching pids are checked (one /proc read each)
INTERNAL_MAX_SLOTS = 1 << 20  # the inference role: one slot per served training episode


def peer_pid(writer) -> int | None:
    """The kernel-reported pid of a Unix-socket peer (SO_PEERCRED), None elsewhere."""
    sock = writer.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                    struct.calcsize("3i")))
    return pid or None


class RingUnavailable(codec.ProtocolError):
    """No ring could be made for an ATTACH (no memory, memfds or seals unavailable).
    The connection boundary answers it like a protocol error: ERROR, then close."""


async def send_fd(writer: asyncio.StreamWriter, fd: int, timeout_s: float) -> None:
    """``send_fds`` of one descriptor (a ring's, after ATTACHED)."""
    await send_fds(writer, [fd], timeout_s)


def make_doorbell_fifo(path: Path) -> Doorbell:
    """A FIFO every client can open for writing; we keep it open read-write (no EOF)."""
    path.unlink(missing_ok=True)
    os.mkfifo(path, 0o600)
    os.chmod(path, 0o600)
    return Doorbell(os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC))


class Spawner(Protocol):
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task: ...


class ShmHost(Protocol):
    """What the ingestor uses of the server it belongs to (``CollectorServer``): declared
    here so that the ingestor does not import the server that builds it."""

    @property
    def cfg(self) -> Config: ...
    @property
    def core(self) -> CollectorCore: ...
    @property
    def writers(self) -> Mapping[int, asyncio.StreamWriter]: ...
    @property
    def background(self) -> Spawner: ...
    @property
    def routes(self) -> Mapping[str, object]: ...
    @property
    def pacer(self) -> Pacer: ...
    @property
    def weights(self) -> Mapping[str, WeightsCache]: ...
    @property
    def first_weights(self) -> asyncio.Event: ...
    @property
    def on_ingest(self) -> Callable[[], None]: ...
    async def kick(self, session: Session, exc: ProtocolError) -> None: ...
    async def ingest(self, policy: str, records: np.ndarray) -> int: ...
    async def wait_for_training(self, session: Session, last_ids: dict[str, int]) -> None: ...
    async def send(self, writer: asyncio.StreamWriter, frame: bytes) -> None: ...
    def refresh_weights(self) -> bool: ...


class ShmIngestor:
    """Attach/drain/detach of shared-memory clients for one CollectorServer.

    Built by the server's ``make_shm`` factory at the end of ``CollectorServer.__init__``
    (``server``: ingest, sessions, writers, background tasks); creates the doorbell FIFO at
    ``doorbell_path``; ``start``/``stop`` register it with the running event loop.
    """

    def __init__(self, server: ShmHost, clients: ShmClients, doorbell_path: Path,
                 attached_info: dict[str, dict]) -> None:
        self.server, self.clients = server, clients
        self.doorbell_path = doorbell_path
        self.doorbell = make_doorbell_fifo(doorbell_path)
        self.attached_info = attached_info
        self.locks: dict[int, asyncio.Lock] = {}
        self.draining = False
        self.next_reap = 0.0

    def start(self) -> None:
        asyncio.get_running_loop().add_reader(self.doorbell.fileno(), self.on_doorbell)

    def stop(self) -> None:
        asyncio.get_running_loop().remove_reader(self.doorbell.fileno())
        self.clients.close()
        self.doorbell.close()
        self.doorbell_path.unlink(missing_ok=True)

    # ------------------------------------------------------------ attach / detach
    async def attach(self, session: Session, capacity: int, policy: str,
                     writer: asyncio.StreamWriter) -> None:
        """ATTACH: create the client's sealed ring for ``policy``, reply ATTACHED, then send
        the ring's fd.

        Called by the server's connection loop. ``RingUnavailable`` when no ring can be
        made; connection errors and timeouts end the connection (which detaches the rings).
        """
        pid = peer_pid(writer)
        try:
            ring = self.clients.attach(session.id, session.stream_id, policy, capacity, pid,
                                       max_slots=INTERNAL_MAX_SLOTS if session.internal else 0)
        except (ShmError, OSError) as exc:
            raise RingUnavailable(f"no shared-memory ring for this client: {exc}") from exc
        self.locks.setdefault(session.id, asyncio.Lock())
        log.info("shm_client_attached", session=session.id, policy=policy, ring=ring.path,
                 capacity_records=ring.capacity, pid=pid)
        name = ring.path.removeprefix(MEMFD_PATH_PREFIX)
        writer.write(codec.encode(codec.Attached(ring_name=name, doorbell_path=str(self.doorbell_path),
                                                 policy=policy, **self.attached_info[policy])))
        assert ring.segment.fd is not None, "create_sealed keeps the memfd open"
        await send_fd(writer, ring.segment.fd, self.server.cfg.server.read_timeout_s)
        ring.segment.close_fd()  # one descriptor fewer per client; our mapping stays

    async def detach(self, session: Session) -> None:
        """The client went away: take what it wrote, then close its ring."""
        if session.id not in self.clients.sessions:
            return
        try:
            await self.drain_session(session)
        except InvalidEpisode:
            pass
        self.clients.detach(session.id)
        self.locks.pop(session.id, None)

    def reap_gone(self) -> None:
        """Called every collector tick, checks at most once a second: close sessions whose
        attaching process has exited (a forked child may still hold the socket open);
        closing detaches the ring."""
        now = time.monotonic()
        if now < self.next_reap:
            return
        self.next_reap = now + REAP_INTERVAL_S
        for sid in self.clients.gone():
            self.clients.sessions[sid].pid = None  # once
            writer = self.server.writers.get(sid)
            log.info("shm_client_gone", session=sid, socket_open=writer is not None)
            if writer is not None:
                writer.close()  # the connection's read loop ends and detaches the ring

    # ------------------------------------------------------------ draining
    def on_doorbell(self) -> None:
        """Event-loop reader callback (and the safety tick): drain every ring."""
        self.doorbell.drain()
        if not self.draining:
            self.draining = True
            self.server.background.spawn(self._drain_all())

    async def _drain_all(self) -> None:
        try:
            while True:
                for sid in dict.fromkeys(sid for sid, _ in self.clients.readable()):
                    session = self.server.core.sessions.get(sid)
                    if session is not None:
                        await self._drain_or_kick(session)
                if not self.clients.readable() and not self.clients.arm():
                    return
        finally:
            self.draining = False

    async def _drain_or_kick(self, session: Session) -> None:
        try:
            await self.drain_session(session)
        except InvalidEpisode as exc:
            await self.server.kick(session, exc)

    async def drain_session(self, session: Session) -> dict[str, int]:
        """Ingest everything readable now from a client's rings; the last ingest id of each
        trainable policy whose ring had records since the last SAMPLE_READY."""
        shm = self.clients.sessions.get(session.id)
        if shm is None:
            return {}
        async with self.locks[session.id]:
            for policy, pr in shm.rings.items():
                while len(rec := self.clients.read(session.id, policy, DRAIN_CHUNK)):
                    steps = int(np.count_nonzero((rec["flags"] & FINAL_OBS) == 0))
                    if policy in self.server.routes:  # a frozen policy's steps are only counted
                        pr.last_ingest_id = await self.server.ingest(policy, rec)
                    self._count(session, shm, policy, steps)
        return {p: pr.last_ingest_id for p, pr in shm.rings.items()
                if pr.unsent and p in self.server.routes}

    def _count(self, session: Session, shm, policy: str, steps: int) -> None:
        episodes = [(r, n) for p, r, n in shm.done_episodes if p == policy]
        shm.done_episodes = [e for e in shm.done_episodes if e[0] != policy]
        self.server.core.count_shm(session, policy, steps, episodes)
        self.server.on_ingest()

    async def sample_ready(self, session: Session, msg: codec.SampleReady, writer) -> None:
        """Drain the client's rings, wait for training if on-policy (every trainable policy
        it wrote steps for), reply WEIGHTS_READY: the versions to read from each board."""
        last_ids = await self.drain_session(session)
        shm = self.clients.sessions.get(session.id)
        for pr in (shm.rings.values() if shm else ()):
            pr.unsent = False
        if msg.get_state:
            await self.server.pacer.wait(last_ids)  # (paced off-policy policies only)
        if msg.get_state and self.server.cfg.sampling.force_on_policy and last_ids:
            await self.server.wait_for_training(session, last_ids)
        await self.server.first_weights.wait()
        self.server.refresh_weights()
        seqs = {p: self.server.weights[p].seq_no for p in session.shm_policies}
        seq = seqs.get(DEFAULT_POLICY, next(iter(seqs.values()), -1))
        session.last_sent_seq = seq
        exploration = exploration_of({p: self.server.weights[p] for p in session.shm_policies})
        await self.server.send(writer, codec.encode(codec.WeightsReady(
            seq, weights_seq_nos=seqs if len(seqs) > 1 or DEFAULT_POLICY not in seqs else None,
            exploration=exploration or None)))
