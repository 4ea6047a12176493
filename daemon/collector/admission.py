"""Who may hold one of the collector's connection places: the anti-flood policy, pure.

A connection is *pending* from its accept until its first message was accepted (with
``server.token`` set: a PING or STATUS carrying the right token; without a token: any
valid first message — clients send PING). Pending connections are capped separately
(``max_pending_connections``, never more than ``max_connections``) and, when a cap is
reached, the *oldest* pending connection is evicted to make room for the newcomer. So a
flood of sockets that connect and send nothing cannot keep a real client out: the real
client's connection is the newest, and it only has to send its PING before as many new
flood sockets arrive as the pending cap holds. Connections that completed the handshake
are never evicted; when every place is held by one, a newcomer is refused (ERROR, close).

``Admission`` only decides and counts; the asyncio shell (``CollectorServer``) closes the
evicted connections, enforces ``handshake_timeout_s`` and reports outcomes back.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """``admitted``: the newcomer gets a place; ``evict``: ids the shell must close first
    (oldest first; empty when refused — nobody is evicted for a refused newcomer)."""

    admitted: bool
    evict: tuple[int, ...] = ()


class Admission:
    """Connection places in arrival order. Called only from the collector's event loop.

    ``arrive(id)`` on every accept, ``handshake_done(id)`` once a connection's first message
    is accepted, ``timed_out(id)`` when its handshake deadline passed, ``leave(id)`` when
    it is closed for any reason (idempotent; also after an eviction). Counters for status:
    ``evictions``, ``handshake_timeouts``, ``refusals``.
    """

    def __init__(self, max_connections: int, max_pending: int) -> None:
        self.max_connections = max_connections
        self.max_pending = min(max_pending, max_connections)
        self.pending: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.established: set[int] = set()
        self.exempt: set[int] = set()  # the daemon's own connections (the inference role's)
        self.evictions = self.handshake_timeouts = self.refusals = 0

    @property
    def open(self) -> int:
        """Connections holding a place (pending + established)."""
        return len(self.pending) + len(self.established)

    def arrive(self, conn_id: int) -> Verdict:
        """A new connection: admit it (evicting the oldest pending ones as needed) or refuse."""
        evict: list[int] = []
        oldest = iter(self.pending)
        if len(self.pending) >= self.max_pending:
            evict.append(next(oldest))
        if self.open - len(evict) >= self.max_connections:
            victim = next(oldest, None)
            if victim is None:
                self.refusals += 1
                return Verdict(admitted=False)
            evict.append(victim)
        for victim in evict:
            del self.pending[victim]
        self.evictions += len(evict)
        self.pending[conn_id] = None
        return Verdict(admitted=True, evict=tuple(evict))

    def handshake_done(self, conn_id: int) -> bool:
        """Its first message was accepted: it keeps its place until it closes. False when
        it holds no pending place (evicted while its message was being read: close it)."""
        if conn_id in self.exempt:
            return True
        if conn_id not in self.pending:
            return False
        del self.pending[conn_id]
        self.established.add(conn_id)
        return True

    def exempt_from_limits(self, conn_id: int) -> None:
        """One of the daemon's own connections (proved by the internal token): it takes no
        place, so clients get every place ``max_connections`` promises."""
        self.pending.pop(conn_id, None)
        self.established.discard(conn_id)
        self.exempt.add(conn_id)

    def timed_out(self, conn_id: int) -> None:
        """Its handshake deadline passed: counted; the shell closes it (then ``leave``)."""
        if conn_id in self.pending:
            self.handshake_timeouts += 1

    def leave(self, conn_id: int) -> None:
        """It closed (or was closed): its place is free. Unknown ids are ignored."""
        self.pending.pop(conn_id, None)
        self.established.discard(conn_id)
        self.exempt.discard(conn_id)

    def report(self) -> dict[str, int]:
        """The status report's admission figures."""
        return {"pending_connections": len(self.pending), "handshake_timeouts": self.handshake_timeouts,
                "evicted_connections": self.evictions, "refused_connections": self.refusals}
