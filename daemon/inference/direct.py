"""Serving connections: the inference role reads, answers and closes every one of them.

The collector accepts a connection and admits it (handshake, token, connection limits);
at its first serving message (or SERVE_DIRECT) it passes the socket over the area channel
with the bytes it had read and not carried out (a TLS connection arrives as one end of a
socket pair the collector relays). From then on this module is its one owner: it reads its
frames, carries out its serving messages with ``Front`` (one message at a time per
connection, the next frame parsed once the reply to the last is out) and writes the replies:
one process hop each way (client -> role -> client).

Each policy has one private lane area for its direct episodes (a sealed memfd made here,
served by the role like any client's area: batched with every other request, recorded and
trained the same way). Who calls what, once per turn of the role's loop:
``service(events)`` reads what the sockets have and publishes requests (at most
MAX_FRAMES_PER_TURN messages per connection, so a flooding client delays no one);
``answer()`` after the serving turn sends the replies whose lanes are answered. An idle
connection with started episodes is handed to the native path (fastpath.py) for its plain
steps and taken back, with its unread bytes and any request in flight, at the first thing
that path does not do (``_hand_over``, ``_take_back``). ``expire``
(about once a second) closes connections past ``server.idle_timeout_s`` /
``server.read_timeout_s``. A refused message: ERROR to that client, then its connection
closes (its episodes end, truncated), as in the collector. Nothing here blocks.

Socket ownership: from the hand-over on, this module is the connection's only owner -- it
frames it (``server.max_message_bytes``), limits it (``server.max_connections``) and times
it out (``expire``, the one place for a serving connection, native-held ones included:
native/direct.c keeps their clocks and never decides to close). The collector closes its
copy of the socket at the hand-over and never parses a serving message (collector/serving.py).
docs/serving.md, "Who owns which socket".
"""
from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass, field

import structlog

from rlinkd.client_lib.protocol import codec, serving
from rlinkd.client_lib.protocol.codec import BadMessage, ProtocolError
from rlinkd.client_lib.transport import DIRECT_REFUSED
from rlinkd.daemon.inference.fastpath import FastPath
from rlinkd.daemon.serving.deadlines import Deadlines
from rlinkd.daemon.inference.front import Episodes, Front, Pending
from rlinkd.daemon.errors import error_kind
from rlinkd.daemon.log import RateLimit

log = structlog.get_logger("inference")
MAX_FRAMES_PER_TURN = 16
READ_AHEAD_BYTES = 1 << 16  # read while busy (a pipelined frame, an EOF) up to this much
RECV_BYTES = 1 << 18  # one read at most (into one buffer reused by every read: a fresh
                     # buffer this large is an mmap and munmap per read, ~12 us of the ~14)
MAX_SKIP = 1024  # Python messages at most between two hand-overs of a connection whose every
                # message the native path gave straight back (e.g. STEP_BATCHes of many entries)
ACCEPTED = (serving.StartEpisode, serving.GetAction, serving.LogReturns, serving.EndEpisode,
            serving.Step, serving.StepBatch)


@dataclass
class Conn:
    """One serving connection."""

    sock: socket.socket
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    episodes: Episodes = field(default_factory=Episodes)
    pending: Pending | None = None
    mask: int = 0
    frame_since: float = 0.0     # when the first byte of an incomplete frame came (0: none)
    last_seen: float = field(default_factory=time.monotonic)
    out_since: float = 0.0       # when unsent reply bytes were first left over (0: none)
    eof: bool = False            # the client shut its side: finish what it sent, then close
    gone: bool = False           # a send failed (closed or reset): replies go nowhere, its
                                 # frames still count
    fast: bool = False           # owned by the native path (fastpath.py) until it gives it back
    skip: int = 0                # messages to carry out here before handing it over again
    misses: int = 0              # hand-overs in a row given back before a message

    @property
    def busy(self) -> bool:
        return self.pending is not None or bool(self.outbuf)


class DirectConnections:
    """The role's serving connections (see the module docstring)."""

    def __init__(self, front: Front, max_connections: int, max_message_bytes: int,
                 idle_timeout_s: float, read_timeout_s: float, native: bool = True) -> None:
        self.front, self.pools = front, front.pools
        self.max_connections, self.max_message_bytes = max_connections, max_message_bytes
        self.deadlines = Deadlines(idle_timeout_s, read_timeout_s)
        self.epoll = select.epoll()
        self.conns: dict[int, Conn] = {}
        self.waiting: set[int] = set()   # connections with a published request
        self.ready: set[int] = set()     # connections with frames left for the next turn
        self.counts = {"direct_connections": 0, "direct_messages": 0, "direct_refused": 0,
                       "direct_errors": 0, "direct_native_messages": 0}
        self.errors_by_kind: dict[str, int] = {}  # direct_errors by ``error_kind``
        self.fast = FastPath.maybe(self.pools, max_message_bytes) if native else None
        self.n_fast = 0  # connections the native path owns now
        self.error_log = RateLimit(per_s=10.0)
        self.rbuf = bytearray(RECV_BYTES)
        self.rview = memoryview(self.rbuf)

    def report(self) -> dict[str, int]:
        """The status counts: ``counts``, the episodes started and open now."""
        return {**self.counts, "direct_episodes_started": self.front.episodes_started,
                "tcp_episodes_open": sum(len(c.episodes.open) for c in self.conns.values())}

    def lanes_free(self) -> dict[str, int]:
        """Each policy's lanes free for new episodes."""
        return {name: len(pool.free) for name, pool in self.pools.items()}

    def fileno(self) -> int:
        """Readable when a connection has something (the role sleeps on it with its others)."""
        return self.epoll.fileno()

    # ------------------------------------------------------------ connections
    def add(self, fd: int, prefix: bytes = b"", ready: bool = False) -> None:
        """A socket from the collector: ``prefix`` is what the collector had read of it and
        not carried out (read before anything the socket holds); ``ready``: it asked with
        SERVE_DIRECT, answered SERVE_DIRECT_READY before anything else."""
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        if len(self.conns) >= self.max_connections:
            self.counts["direct_refused"] += 1
            _try_send(sock, codec.encode(codec.Error(
                message=f"{DIRECT_REFUSED} {self.max_connections} direct serving connections are open "
                        "(server.max_connections)")))
            sock.close()
            return
        conn = self.conns[fd] = Conn(sock, inbuf=bytearray(prefix), mask=select.EPOLLIN)
        self.epoll.register(fd, select.EPOLLIN)
        self.counts["direct_connections"] = len(self.conns)
        if ready:
            conn.outbuf += codec.encode(serving.ServeDirectReady())
            self._flush(fd, conn)
        if prefix:
            self.ready.add(fd)

    def close(self, fd: int, reason: str = "") -> None:
        """End a connection: its episodes' lanes go back (their fragments end, truncated)."""
        conn = self.conns.pop(fd, None)
        if conn is None:
            return
        if reason:
            log.debug("direct_connection_closed", reason=reason[:200])
        if conn.fast:
            self.fast.native.drop(fd)  # type: ignore[union-attr]
            self.n_fast -= 1
        self.front.forget(conn.episodes)
        self.waiting.discard(fd)
        self.ready.discard(fd)
        if conn.mask >= 0:
            self.epoll.unregister(fd)
        conn.sock.close()
        self.counts["direct_connections"] = len(self.conns)

    def close_all(self, goodbye: str = "") -> None:
        """Close every connection (``goodbye``: an ERROR each gets first, best effort) and
        drop the native path. Called once, before the role closes the lane areas: the
        native path holds views of them (a view that outlived its area would read unmapped
        memory)."""
        try:
            for fd, conn in list(self.conns.items()):
                if goodbye:
                    _try_send(conn.sock, bytes(conn.outbuf) + codec.encode(codec.Error(message=goodbye)))
                self.close(fd)
        finally:
            self.fast = None
            self.epoll.close()

    # ------------------------------------------------------------ one turn
    def poll(self) -> list[tuple[int, int]]:
        """Events waiting now (no wait)."""
        return self.epoll.poll(0) if self.conns else []

    @property
    def has_work(self) -> bool:
        """Frames left from the last turn (the role must not sleep on them)."""
        return bool(self.ready) or bool(self.n_fast and self.fast.native.state[1])  # type: ignore[union-attr]

    def service(self, events: list[tuple[int, int]]) -> None:
        """Read and write what ``events`` allow, then carry out complete frames (the
        native path first, on the connections it owns)."""
        if self.n_fast:
            events, demoted, published, messages = self.fast.native.service(events)  # type: ignore[union-attr]
            self.counts["direct_messages"] += messages
            self.counts["direct_native_messages"] += messages
            self.fast.published(published)  # type: ignore[union-attr]
            self._take_back(demoted)
        for fd, ev in events:
            conn = self.conns.get(fd)
            if conn is None:
                continue
            if conn.eof:  # (only EPOLLOUT is asked for now; HUP/ERR: nobody reads replies)
                conn.gone = conn.gone or bool(ev & (select.EPOLLHUP | select.EPOLLERR))
                self._flush(fd, conn)
                continue
            if ev & select.EPOLLOUT:
                self._flush(fd, conn)
            if fd in self.conns and ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                self._read(fd, conn)
        for fd in list(self.ready):
            self.ready.discard(fd)
            if fd in self.conns:
                self._advance(fd, self.conns[fd])

    @property
    def answering(self) -> bool:
        """Requests in flight, or lanes of closed connections on their way back to free:
        ``answer`` has work after a serving turn."""
        return (bool(self.waiting) or bool(self.n_fast and self.fast.native.state[0])  # type: ignore[union-attr]
                or any(pool.busy for pool in self.pools.values()))

    def answer(self) -> int:
        """After a serving turn: replies for requests whose lanes are answered (and closed
        connections' lanes freed once released). Returns the replies."""
        replies = 0
        if self.n_fast:
            demoted, replies = self.fast.native.answer()  # type: ignore[union-attr]
            self._take_back(demoted)
        done = [fd for fd in self.waiting if self.conns[fd].pending.answered(self.pools)]  # type: ignore[union-attr]
        for fd in done:
            self.waiting.discard(fd)
            conn = self.conns[fd]
            pending, conn.pending = conn.pending, None
            try:
                reply = pending.finish()  # type: ignore[union-attr]
            except BadMessage as exc:
                self._refuse(fd, conn, exc)
                continue
            self._reply(fd, conn, reply)
        for pool in self.pools.values():
            if pool.busy:
                pool.sweep()
        return replies + len(done)

    def expire(self, now: float) -> None:
        """Close connections past their limits (``serving.deadlines``: silent past
        idle_timeout_s, or stalled in a frame or a reply past read_timeout_s)."""
        for fd, conn in list(self.conns.items()):
            frame_since, last_seen, busy = conn.frame_since, conn.last_seen, conn.busy
            if conn.fast:
                last_seen, frame_since, busy = self.fast.native.times(fd)  # type: ignore[union-attr]
            reason = self.deadlines.overdue(now, last_seen, frame_since, conn.out_since, busy)
            if reason is not None:
                self.close(fd, reason)

    # ------------------------------------------------------------ reading
    def _read(self, fd: int, conn: Conn) -> None:
        try:
            got = conn.sock.recv_into(self.rbuf)
        except (BlockingIOError, InterruptedError):
            return
        except ConnectionResetError:  # (TCP drops what was unread: nothing more to take)
            got, conn.gone = 0, True
        except OSError as exc:
            return self.close(fd, str(exc))
        if not got:  # (what it sent before still counts: an END's steps train)
            conn.eof = True
        conn.inbuf += self.rview[:got]
        conn.last_seen = time.monotonic()
        if not conn.busy:
            self._advance(fd, conn)
        else:
            self._watch(fd, conn)

    def _advance(self, fd: int, conn: Conn) -> None:
        """Carry out complete frames until one waits for an answer (at most
        MAX_FRAMES_PER_TURN; the rest next turn)."""
        for _ in range(MAX_FRAMES_PER_TURN):
            if conn.busy or conn.fast:
                break
            try:
                body = self._frame(conn)
                if body is None:
                    break
                self._carry_out(fd, conn, codec.decode_body(body))
            except ProtocolError as exc:
                return self._refuse(fd, conn, exc)
            if fd not in self.conns:
                return
        else:
            self.ready.add(fd)
        if conn.eof and not conn.busy and fd not in self.ready:
            return self.close(fd, "closed by the client")
        self._watch(fd, conn)
        self._hand_over(fd, conn)

    def _frame(self, conn: Conn) -> bytes | None:
        """The next complete frame's body, taken off the buffer (None: not complete yet)."""
        buf = conn.inbuf
        end = self._frame_end(buf)
        if end is None or len(buf) < end:
            conn.frame_since = (conn.frame_since or time.monotonic()) if buf else 0.0
            return None
        body = bytes(buf[codec.HEADER_BYTES:end])
        del buf[:end]
        conn.frame_since = 0.0  # (the next frame's clock starts when it is looked for)
        return body

    def _frame_end(self, buf: bytearray) -> int | None:
        """Where the buffer's first frame ends (None: its header is incomplete); a bad
        header raises (ProtocolError)."""
        if len(buf) < codec.HEADER_BYTES:
            return None
        return codec.HEADER_BYTES + codec.parse_header(bytes(buf[:codec.HEADER_BYTES]),
                                                       self.max_message_bytes)

    def _carry_out(self, fd: int, conn: Conn, msg: codec.Message) -> None:
        self.counts["direct_messages"] += 1
        conn.skip = max(0, conn.skip - 1)
        if isinstance(msg, codec.Ping):
            return self._reply(fd, conn, codec.encode(codec.Pong()))
        if not isinstance(msg, ACCEPTED):
            raise BadMessage(f"{msg.TYPE.value} is not accepted on a serving connection (only "
                             "serving messages and PING; METRICS and the rest go on another one)")
        outcome = self.front.begin(conn.episodes, msg)
        if isinstance(outcome, Pending):
            conn.pending = outcome
            self.waiting.add(fd)
        else:
            self._reply(fd, conn, outcome)

    # ------------------------------------------------------------ the native path
    def _hand_over(self, fd: int, conn: Conn) -> bool:
        """Give an idle, clean connection with steppable episodes to the native path."""
        if (self.fast is None or conn.fast or conn.skip or conn.busy or conn.inbuf or conn.eof
                or conn.gone or conn.mask != select.EPOLLIN or fd not in self.conns):
            return False
        episodes = self.fast.steppable(conn.episodes)
        if not episodes:
            return False
        self.fast.native.promote(fd, episodes, conn.last_seen)
        conn.fast = True
        self.n_fast += 1
        return True

    def _take_back(self, demoted: list[tuple]) -> None:
        """Connections the native path gave back (``service``'s and ``answer``'s lists, each
        (fd, unread bytes, unsent reply bytes, (episode_id, batch) of a request in flight or
        None, eof, gone, error or None, last_seen, frame_since, messages it carried out)):
        carry on where it stopped. Called before any other event of the turn is handled
        (the unread bytes come before what the socket holds)."""
        for fd, inbuf, outbuf, inflight, eof, gone, error, last_seen, frame_since, handled in demoted:
            conn = self.conns[fd]
            conn.fast, self.n_fast = False, self.n_fast - 1
            conn.misses = 0 if handled else conn.misses + 1
            conn.skip = 0 if handled else min(2 ** conn.misses - 1, MAX_SKIP)
            conn.inbuf[:0] = inbuf
            conn.last_seen, conn.frame_since = last_seen, frame_since
            conn.eof, conn.gone = conn.eof or eof, conn.gone or gone
            if error:
                self.close(fd, error)
                continue
            if inflight is not None:
                conn.pending = self.front.resume(conn.episodes, *inflight)
                self.waiting.add(fd)
            if outbuf:
                conn.outbuf += outbuf
                self._flush(fd, conn)
            else:
                self.ready.add(fd)
                self._watch(fd, conn)

    # ------------------------------------------------------------ writing
    def _reply(self, fd: int, conn: Conn, frame: bytes | None) -> None:
        conn.last_seen = time.monotonic()
        if frame is not None:
            conn.outbuf += frame
            self._flush(fd, conn)
        if fd in self.conns and not conn.busy:
            self.ready.add(fd)  # (a frame read meanwhile may be complete)
            if self._hand_over(fd, conn):
                self.ready.discard(fd)

    def _flush(self, fd: int, conn: Conn) -> None:
        """Send what the socket takes; after the client's EOF a failed send means nobody
        reads replies any more (they are dropped; its frames are still carried out)."""
        sent = 0
        try:
            if not conn.gone:
                sent = conn.sock.send(conn.outbuf)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # (the client closed: what it sent before still counts)
            conn.gone = True
        if conn.gone:
            conn.outbuf.clear()
        del conn.outbuf[:sent]
        conn.out_since = (conn.out_since or time.monotonic()) if conn.outbuf else 0.0
        if not conn.outbuf and (conn.inbuf or conn.eof):
            self.ready.add(fd)
        self._watch(fd, conn)

    def _refuse(self, fd: int, conn: Conn, exc: Exception) -> None:
        """ERROR to this client only, then close its connection."""
        self.counts["direct_errors"] += 1
        kind = error_kind(exc)
        self.errors_by_kind[kind] = self.errors_by_kind.get(kind, 0) + 1
        if self.error_log.allow():  # (as the collector logs its protocol errors)
            log.warning("direct_protocol_error", error=str(exc)[:300],
                        suppressed_before=self.error_log.take_suppressed())
        _try_send(conn.sock, bytes(conn.outbuf) + codec.encode(codec.Error(message=str(exc)[:1000])))
        conn.outbuf.clear()
        self.close(fd, str(exc))

    def _watch(self, fd: int, conn: Conn) -> None:
        """Poll for what the connection can use now: input while less than READ_AHEAD_BYTES
        are buffered or no whole frame is (so a flood of messages without replies waits in
        the client's socket, not here; none after its EOF), output while a reply is left
        over; nothing once it reset."""
        if conn.mask < 0:
            return
        if conn.gone and conn.eof:  # (a closed socket would report itself forever)
            self.epoll.unregister(fd)
            conn.mask = -1
            return
        mask = 0
        if not conn.eof and (len(conn.inbuf) < READ_AHEAD_BYTES or not self._has_frame(conn.inbuf)):
            mask |= select.EPOLLIN
        if conn.outbuf and not conn.gone:
            mask |= select.EPOLLOUT
        if mask != conn.mask:
            self.epoll.modify(fd, mask)
            conn.mask = mask

    def _has_frame(self, buf: bytearray) -> bool:
        try:
            end = self._frame_end(buf)
        except ProtocolError:
            return True  # (refused when it is parsed)
        return end is not None and len(buf) >= end


def _try_send(sock: socket.socket, data: bytes) -> None:
    """Best effort (an ERROR before closing): what does not fit now is dropped."""
    try:
        sock.send(data)
    except OSError:
        pass

