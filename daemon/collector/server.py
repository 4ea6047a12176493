"""The collector's asyncio shell: listeners, connections, the episode ring, the inbox.

One event loop serves every TCP and Unix-socket connection (>= 64 at once), writes
validated records into the collector→connector ring (in ingest-id order, under one
FIFO lock, awaiting space when the ring is full so a slow learner slows clients
down instead of growing memory; the connector's space doorbell ends the wait),
answers SET_STATE from ``WeightsCache``, and releases on-policy waiters when the
learner says which ingest ids it trained on.
A bad frame costs only its own connection: ERROR reply, close, count, log.
"""
from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

import numpy as np
import structlog

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.client_lib.protocol.codec import ProtocolError
from rlinkd.client_lib.protocol.serving import ServeAttach
from rlinkd.client_lib.transport import EVICTED, SHUTTING_DOWN
from rlinkd.daemon.collector.core import CollectorCore, HandedOver, Plan, Session
from rlinkd.daemon.collector.status import StatusBuilder
from rlinkd.daemon.collector.pacing import Pacer
from rlinkd.daemon.collector.rllib_msgpack import MSGPACK, RllibFlavour, flavour_of
from rlinkd.daemon.collector.weights import WeightsCache, set_state_frame
from rlinkd.daemon.config import Config
from rlinkd.daemon.log import RateLimit
from rlinkd.daemon.errors import RlinkdError, error_kind
from rlinkd.daemon.serving.deadlines import Deadlines
from rlinkd.shm.records import FLUSH, STREAM_END
from rlinkd.shm.errors import ShmError
from rlinkd.shm.ring import StepRing

if TYPE_CHECKING:
    from rlinkd.daemon.collector.serving import ServingFront
    from rlinkd.daemon.collector.shm_server import ShmIngestor

log = structlog.get_logger("collector")


class Background:
    """Fire-and-forget tasks whose unexpected failure is not lost: the first one is kept
    in ``fatal`` and ``failed`` is set, so the process shell stops and exits CRASH."""

    def __init__(self) -> None:
        self.fatal: BaseException | None = None
        self.failed = asyncio.Event()
        self.tasks: set[asyncio.Task] = set()

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        """Record an unexpected failure (the first one wins); the shell stops and exits CRASH.
        Also for plain callbacks (inbox reader), whose exceptions asyncio would only log."""
        if self.fatal is None:
            self.fatal = exc
            self.failed.set()


class HandshakeTimeout(RlinkdError):
    """A connection's first message was not complete within ``server.handshake_timeout_s``."""


class EpisodeRoute:
    """One trainable policy's episode ring (producer side), written in ingest-id order;
    ingest ids are per ring. ``lock``: one FIFO lock shared by every route (the server sets
    it): all rings share one space doorbell, and two writers awaiting that one fd at once
    would take each other's wake-ups."""

    def __init__(self, ring: StepRing) -> None:
        self.ring, self.lock, self.next_ingest_id = ring, asyncio.Lock(), 1

    @property
    def last_id(self) -> int:
        return self.next_ingest_id - 1


class CollectorServer:
    """Owns the event-loop side of the collector. Built and run by ``collector.process``.

    Everything arrives through the constructor: ``core`` (protocol semantics), ``routes``
    (each trainable policy's episode ring, producer side, with its space doorbell),
    ``weights`` (each policy's SET_STATE), ``status`` (answers STATUS), ``make_shm`` (called
    once, last, with this server: builds the ``ShmIngestor`` for shared-memory clients),
    ``ssl_ctx`` (TLS or None), ``on_ingest`` (called after every ingest, e.g. to publish
    counters) and ``rllib`` (answers RLlib's msgpack-flavour clients; None: refused).
    """

    def __init__(self, core: CollectorCore, routes: dict[str, EpisodeRoute],
                 weights: dict[str, WeightsCache], status: StatusBuilder,
                 make_shm: Callable[[CollectorServer], ShmIngestor],
                 ssl_ctx: ssl.SSLContext | None = None,
                 on_ingest: Callable[[], None] = lambda: None,
                 serving: ServingFront | None = None, pacer: Pacer | None = None,
                 rllib: RllibFlavour | None = None) -> None:
        self.core, self.routes, self.weights, self.status = core, routes, weights, status
        shared = asyncio.Lock()
        for route in routes.values():
            route.lock = shared
        self.cfg = core.cfg
        self.deadlines = Deadlines.of(self.cfg.server)
        self.on_ingest = on_ingest
        self.ssl_ctx = ssl_ctx
        self.waiters: dict[int, asyncio.Future] = {}
        self.pacer = pacer or Pacer({}, 0.0)
        self.first_weights = asyncio.Event()
        self.writers: dict[int, asyncio.StreamWriter] = {}
        self.servers: list[asyncio.AbstractServer] = []
        self.draining = False
        self.port = 0
        self.background = Background()
        self.error_log = RateLimit(per_s=10.0)
        self.shm = make_shm(self)
        self.serving = serving
        self.rllib = rllib

    # ------------------------------------------------------------ listeners
    async def start(self) -> None:
        srv = self.cfg.server
        handshake_s = srv.handshake_timeout_s if self.ssl_ctx else None  # only meaningful with TLS
        tcp = await asyncio.start_server(lambda r, w: self._serve(r, w, "tcp"), srv.host,
                                         srv.port, reuse_address=True, limit=1 << 20,
                                         ssl=self.ssl_ctx, ssl_handshake_timeout=handshake_s)
        self.port = tcp.sockets[0].getsockname()[1]
        path = str(self.cfg.socket_path)
        if os.path.exists(path):
            os.unlink(path)
        old_umask = os.umask(0o177)
        try:
            unix = await asyncio.start_unix_server(lambda r, w: self._serve(r, w, "unix"), path)
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        self.servers = [tcp, unix]

    async def stop_accepting(self) -> None:
        for server in self.servers:
            server.close()
        self.servers = []

    # ------------------------------------------------------------ one connection
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     transport: str) -> None:
        peer = str(writer.get_extra_info("peername") or transport)
        _set_nodelay(writer)
        if self.draining:
            await self._refuse(writer, SHUTTING_DOWN)
            return
        session = self.core.open_session(peer, transport)
        verdict = self.core.admission.arrive(session.id)
        if not verdict.admitted:
            self.core.close_session(session)
            await self._refuse(writer, "too many connections")
            return
        self.writers[session.id] = writer
        for victim in verdict.evict:
            self._evict(victim)
        try:
            await self._message_loop(session, reader, writer)
        except ProtocolError as exc:
            await self._protocol_error(session, writer, exc)
        except HandshakeTimeout:
            await self._refuse(writer, "no complete message within server.handshake_timeout_s")
        except HandedOver:
            pass
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError, ssl.SSLError):
            pass
        finally:
            self._forget(session)
            writer.close()

    async def _message_loop(self, session: Session, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
        """The handshake (first message, within handshake_timeout_s), then every other message."""
        body = await self._first_frame(session, reader)
        started = time.perf_counter()  # from the whole frame read to the reply written
        session.flavour = flavour_of(body)
        msg, plan = self._handle(session, body)
        if not self.core.admission.handshake_done(session.id):
            raise ConnectionAbortedError("evicted while its first message was read")
        while True:
            await self._carry_out(session, plan, body, reader, writer)
            self.status.message_latency.observe(msg.TYPE.value, time.perf_counter() - started)
            body = await self._read_frame(reader)
            started = time.perf_counter()
            msg, plan = self._handle(session, body)

    def _handle(self, session: Session, body: bytes) -> tuple[codec.Message, Plan]:
        """Decode one body in the connection's flavour and decide what it does."""
        if session.flavour == MSGPACK:
            if self.rllib is None:
                raise codec.BadMessage("this server does not speak RLlink's msgpack flavour")
            msg = self.rllib.decode(body)
            return msg, self.rllib.handle(session, msg)
        msg = codec.decode_body(body)
        return msg, self.core.handle(session, msg)

    async def _first_frame(self, session: Session, reader: asyncio.StreamReader) -> bytes:
        """The connection's first frame, complete within ``handshake_timeout_s`` of the accept
        (HandshakeTimeout otherwise, counted in status). A frame that stalls past its own
        ``read_timeout_s`` first is closed silently, like any later frame."""
        limit_s = self.cfg.server.handshake_timeout_s
        loop = asyncio.get_running_loop()
        started = loop.time()  # the timers' own clock (uvloop's lags time.monotonic())
        try:
            return await asyncio.wait_for(self._read_frame(reader), limit_s)
        except asyncio.TimeoutError:
            if loop.time() - started < limit_s:
                raise  # the frame's read timeout, not the handshake's
            self.core.admission.timed_out(session.id)
            raise HandshakeTimeout from None

    def _evict(self, session_id: int) -> None:
        """Close a connection still in its handshake to make room for a newer one (ERROR
        first: an honest but slow client learns why, and client_lib reconnects on it). Its
        read loop ends and forgets it."""
        writer = self.writers.get(session_id)
        if writer is None:
            return
        if self.error_log.allow():
            log.warning("connection_evicted", session=session_id, reason="pending connections full",
                        suppressed_before=self.error_log.take_suppressed())
        writer.write(codec.encode(codec.Error(message=f"{EVICTED} too many connections waiting for "
                                                      "their handshake")))
        writer.close()

    async def _read_frame(self, reader: asyncio.StreamReader) -> bytes:
        """First byte within idle_timeout_s; the rest of the frame within read_timeout_s
        (``serving.deadlines``). Bytes already buffered are taken without any timer (the hot
        path of a busy client)."""
        limits = self.deadlines
        first = await read_within(reader, 1, limits.first_byte_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.frame_s  # one budget for header and body
        rest = await read_within(reader, codec.HEADER_BYTES - 1, limits.frame_s)
        size = codec.parse_header(first + rest, self.cfg.server.max_message_bytes)
        return await read_within(reader, size, max(0.0, deadline - loop.time()))

    async def _carry_out(self, session: Session, plan: Plan, body: bytes, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        """Carry out one decided message (``body``: its bytes, for a serving connection's
        hand-over)."""
        last_ids = {}
        if plan.records is not None:
            for policy, records in plan.records.items():
                last_ids[policy] = await self.ingest(policy, records)
            self.on_ingest()
        if plan.reply is not None:
            await self.send(writer, plan.reply)
        if plan.status:
            await self.send(writer, codec.encode(codec.StatusReport(status=self.status.build(self.port))))
        if plan.attach is not None:
            await self.shm.attach(session, plan.attach, plan.attach_policy, writer)
        if plan.shm_sample is not None:
            await self.shm.sample_ready(session, plan.shm_sample, writer)
        if plan.serve is not None:
            if self.serving is None:
                raise codec.BadMessage(f"{plan.serve.TYPE.value}: this server does not serve actions")
            if not isinstance(plan.serve, ServeAttach):
                self.writers.pop(session.id, None)  # (the role's from now on: no goodbye from here)
            await self.serving.handle(session, plan.serve, body, reader, writer)
        held = plan.held
        if plan.newest_state or plan.wait_for_training:
            await self.pacer.wait(last_ids)  # (paced off-policy policies only)
        if plan.newest_state:
            await self._send_state(session, writer, held)
        if plan.wait_for_training:
            assert last_ids, "a plan waits for training only on records it ingested"
            await self.wait_for_training(session, last_ids)
            await self._send_state(session, writer, held)

    async def send(self, writer: asyncio.StreamWriter, frame: bytes) -> None:
        writer.write(frame)  # one write per message
        if writer.transport.get_write_buffer_size():  # else it all went out: nothing to wait for
            await asyncio.wait_for(writer.drain(), self.deadlines.reply_s)

    async def _send_state(self, session: Session, writer: asyncio.StreamWriter,
                          held: dict[str, int] | None = None) -> None:
        await self.first_weights.wait()
        for cache in self.weights.values():
            cache.refresh()
        session.last_sent_seq = self.weights[DEFAULT_POLICY].seq_no
        session.last_sent_seqs = {p: c.seq_no for p, c in self.weights.items()}
        await self.send(writer, self.rllib.set_state_frame() if self.rllib and session.flavour == MSGPACK
                        else set_state_frame(self.weights, held))

    def refresh_weights(self) -> bool:
        """Re-read every policy's board; True (and ``first_weights`` set) once every policy
        has a frame. Called on WeightsPublished and on the collector's tick."""
        for cache in self.weights.values():
            cache.refresh()
        ready = all(cache.ready for cache in self.weights.values())
        if ready:
            self.first_weights.set()
        return ready

    @staticmethod
    def _error_frame(session: Session | None, message: str) -> bytes:
        """An ERROR in the connection's flavour (JSON before its first message is read)."""
        if session is not None and session.flavour == MSGPACK:
            return RllibFlavour.error_frame(message)
        return codec.encode(codec.Error(message=message[:1000]))

    async def _protocol_error(self, session: Session, writer: asyncio.StreamWriter,
                              exc: ProtocolError) -> None:
        self.core.count_protocol_error(error_kind(exc))
        if self.error_log.allow():
            log.warning("protocol_error", peer=session.peer, error=str(exc)[:300],
                        suppressed_before=self.error_log.take_suppressed())
        frame = self._error_frame(session, str(exc))
        try:
            await self.send(writer, frame)
        except (ConnectionError, asyncio.TimeoutError, RuntimeError):
            pass

    async def _refuse(self, writer: asyncio.StreamWriter, reason: str) -> None:
        try:
            await self.send(writer, codec.encode(codec.Error(message=reason)))
        except (ConnectionError, asyncio.TimeoutError):
            pass
        writer.close()

    def _forget(self, session: Session) -> None:
        self.core.close_session(session)
        self.core.admission.leave(session.id)
        if session.is_shm:
            self.shm.clients.leave(session.id)  # or the drain loop would spin on a session-less ring
        self.writers.pop(session.id, None)
        self.waiters.pop(session.id, None)
        if self.serving is not None:
            self.serving.forget(session)
        if session.is_sampler or session.is_shm:  # an attached ring goes even if never used
            self.background.spawn(self._end_stream(session))
        self.maybe_flush()

    async def _end_stream(self, session: Session) -> None:
        """Take the rest of a shm client's rings, then tell the connector every stream of the
        connection ended (its own, in each policy's ring, and each shm agent slot's)."""
        streams = [(policy, session.stream_id) for policy in self.routes]
        if session.is_shm:
            streams += self.shm.clients.streams(session.id)
            await self.shm.detach(session)
        for policy, stream in dict.fromkeys(streams):
            if policy in self.routes:
                marker = np.zeros(1, self.routes[policy].ring.layout.dtype)
                marker["flags"], marker["stream_id"] = STREAM_END, stream
                await self.ingest(policy, marker)

    async def kick(self, session: Session, exc: ProtocolError) -> None:
        """Bad data from a session outside its own read loop (its shm ring): ERROR + close."""
        writer = self.writers.get(session.id)
        if writer is not None:
            await self._protocol_error(session, writer, exc)
            writer.close()

    # ------------------------------------------------------------ episode rings
    async def ingest(self, policy: str, records: np.ndarray) -> int:
        """Assign ingest ids and write records in order into ``policy``'s episode ring; waits
        (FIFO) while the ring is full. Returns the last ingest id written."""
        route = self.routes[policy]
        async with route.lock:
            n = len(records)
            records["ingest_id"] = np.arange(route.next_ingest_id, route.next_ingest_id + n)
            route.next_ingest_id += n
            done = 0
            while done < n:
                done += route.ring.write_batch(records[done:])
                if done < n:
                    await wait_for_space(route.ring)
            return route.last_id

    async def _write_flush_marker(self, policy: str) -> None:
        route = self.routes[policy]
        marker = np.zeros(1, route.ring.layout.dtype)
        marker["flags"] = FLUSH
        async with route.lock:
            marker["ingest_id"] = route.last_id
            while route.ring.write_batch(marker) == 0:
                await wait_for_space(route.ring)

    # ------------------------------------------------------------ on-policy waits
    async def wait_for_training(self, session: Session, last_ids: dict[str, int]) -> None:
        """Until every policy of ``last_ids`` published weights trained on those ingest ids
        (at once when they all have already)."""
        if not self.core.waits.start_wait(session, last_ids, time.monotonic()):
            return
        fut = asyncio.get_running_loop().create_future()
        self.waiters[session.id] = fut
        self.maybe_flush()
        await fut
        if self.draining:
            raise ConnectionAbortedError("draining")

    def maybe_flush(self) -> None:
        """Ask the connector of each policy for a batch now when every on-policy sampler is
        waiting (or one waited too long) and some wait for that policy."""
        samplers, now = self.core.on_policy_samplers(), time.monotonic()
        for policy, route in self.routes.items():
            if self.core.waits.should_flush(samplers, policy, route.last_id, now):
                self.core.waits.last_flush_cutoff[policy] = route.last_id
                self.background.spawn(self._write_flush_marker(policy))

    def on_weights_published(self, policy: str, cutoff_ingest_id: int) -> None:
        """``policy``'s learner trained on its ingest ids <= cutoff (-1: none): refresh the
        frames, release the waiters this completes."""
        self.refresh_weights()
        for session in self.core.waits.released(self.core.on_policy_samplers(), policy,
                                                cutoff_ingest_id):
            fut = self.waiters.pop(session.id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------ shutdown
    async def drain(self, reason: str) -> None:
        """Stop accepting; every client gets ERROR with the reason and is disconnected.

        Called once by the process shell on Drain/Stop. All goodbyes run concurrently and
        end within ``drain_budget_s(cfg)``: a client that does not take its ERROR by then
        (it never reads, its buffers are full) has its connection aborted, so hundreds of
        stalled clients cost one deadline, not one timeout each.
        """
        self.draining = True
        await self.stop_accepting()
        message = f"{SHUTTING_DOWN}: {reason}"
        goodbyes = [(writer, self._error_frame(self.core.sessions.get(sid), message))
                    for sid, writer in self.writers.items()]
        await say_goodbye_to_all(goodbyes, drain_budget_s(self.cfg))
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_result(None)


DRAIN_SHARE_OF_SHUTDOWN = 0.5
"""Part of ``daemon.shutdown_timeout_s`` the collector gives its clients to take their
ERROR; the rest covers the collector's exit and the supervisor's own steps."""


def drain_budget_s(cfg: Config) -> float:
    """How long the shutdown drain waits for all clients together."""
    return cfg.daemon.shutdown_timeout_s * DRAIN_SHARE_OF_SHUTDOWN


async def say_goodbye_to_all(goodbyes: list[tuple[asyncio.StreamWriter, bytes]],
                             timeout_s: float) -> None:
    """Send each writer its frame at once and close them all within ``timeout_s``."""
    await asyncio.gather(*(_say_goodbye(w, frame, timeout_s) for w, frame in goodbyes))


async def _say_goodbye(writer: asyncio.StreamWriter, frame: bytes, timeout_s: float) -> None:
    """Send ``frame`` and close; abort the connection if it is not flushed within ``timeout_s``.
    Never raises for a broken or stalled peer (each client's fate is its own)."""
    try:
        writer.write(frame)
        await asyncio.wait_for(writer.drain(), timeout_s)
    except (ConnectionError, asyncio.TimeoutError, RuntimeError):
        writer.transport.abort()  # close() would keep a stalled socket until its data is read
        return
    writer.close()


async def wait_for_space(ring: StepRing) -> None:
    """Event-loop producer: return once at least one record fits in ``ring`` (or after
    one sleep slice; the caller loops until its records are written).

    Announces the wait (``arm_space_wait``) and awaits the ring's space doorbell, which
    the consumer rings after freeing space: no polling. A sleep lasts at most
    ``ring.max_sleep_slice_s`` (bounds a lost wake-up). Called by ``ingest`` and the
    flush marker, under the server's ring lock (one producer).
    """
    if ring.arm_space_wait(1):
        ring.disarm_space_wait()
        return
    if ring.space_doorbell is None:
        raise ShmError(f"{ring!r} has no space doorbell to wait on")
    loop = asyncio.get_running_loop()
    woke: asyncio.Future[None] = loop.create_future()
    fd = ring.space_doorbell.fileno()

    def wake() -> None:
        if not woke.done():
            woke.set_result(None)
    loop.add_reader(fd, wake)
    try:
        await asyncio.wait([woke], timeout=ring.max_sleep_slice_s)
    finally:
        loop.remove_reader(fd)
        ring.disarm_space_wait()


async def read_within(reader: asyncio.StreamReader, n: int, timeout_s: float | None) -> bytes:
    """``readexactly(n)``, with a timer only when the bytes are not all buffered yet."""
    if buffered(reader) >= n:
        return await reader.readexactly(n)
    return await within(reader.readexactly(n), timeout_s)


async def within(aw, timeout_s: float | None):
    """``aw`` with a timeout (``asyncio.TimeoutError``): ``asyncio.timeout`` (a timer on the
    running task) where Python has it, else ``wait_for`` (which costs a task)."""
    timeout = getattr(asyncio, "timeout", None)
    if timeout is None or timeout_s is None:
        return await asyncio.wait_for(aw, timeout_s)
    async with timeout(timeout_s):
        return await aw


def buffered(reader: asyncio.StreamReader) -> int:
    """Bytes a StreamReader holds already. ``readexactly`` of at most that many completes
    without suspending, so the hot path skips ``wait_for`` (a task and a loop turn each).
    Reads asyncio's private buffer (stable since Python 3.4); 0 if it is ever gone."""
    return len(getattr(reader, "_buffer", b""))


def _set_nodelay(writer: asyncio.StreamWriter) -> None:
    sock: Any = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
