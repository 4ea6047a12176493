"""The time limits of a connection's frames and replies: one rule, whichever process owns
the socket.

A frame's first byte within ``server.idle_timeout_s`` (0: no limit) of the connection's last
activity; the rest of that frame (header and body, at most ``server.max_message_bytes``)
within ``server.read_timeout_s`` of its first byte; a reply taken by the client within
``server.read_timeout_s``. The next frame is read only once the last is answered, so a
connection whose request is in flight ("busy") is on neither read clock.

Every serving connection's owner, the inference role (inference/direct.py), checks its
connections' clocks against ``overdue`` about once a second; the collector applies the same
limits to the connections it serves (RLlink clients, and every connection until its first
serving message) as timers on its reads and writes (``first_byte_s``, ``frame_s``, ``reply_s``).
"""
from __future__ import annotations

from dataclasses import dataclass

from rlinkd.daemon.config import ServerConfig


@dataclass(frozen=True)
class Deadlines:
    """``idle_s``: ``server.idle_timeout_s`` (0: none); ``read_s``: ``server.read_timeout_s``."""

    idle_s: float
    read_s: float

    @classmethod
    def of(cls, server: ServerConfig) -> Deadlines:
        return cls(server.idle_timeout_s, server.read_timeout_s)

    @property
    def first_byte_s(self) -> float | None:
        """The limit on a frame's first byte (None: none)."""
        return self.idle_s or None

    @property
    def frame_s(self) -> float:
        """The limit on the rest of a frame, from its first byte."""
        return self.read_s

    @property
    def reply_s(self) -> float:
        """The limit on a reply's bytes being taken by the client."""
        return self.read_s

    def overdue(self, now: float, last_seen: float, frame_since: float, out_since: float,
                busy: bool) -> str | None:
        """Why a connection is past its limits, None when it is not. Times in seconds on one
        clock: ``last_seen`` its last activity, ``frame_since`` the first byte of an
        incomplete frame (0: none), ``out_since`` when reply bytes were first left unsent
        (0: none); ``busy``: a request of it is in flight or a reply is unsent."""
        if frame_since and not busy and now - frame_since > self.frame_s:
            return "a frame incomplete past server.read_timeout_s"
        if out_since and now - out_since > self.reply_s:
            return "a reply unread past server.read_timeout_s"
        if self.idle_s and not busy and now - last_seen > self.idle_s:
            return "idle past server.idle_timeout_s"
        return None
