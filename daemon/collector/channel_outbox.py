"""The collector's sending end of the area channel: datagrams in order, none lost to a
momentarily full queue.

The channel is a SOCK_SEQPACKET socketpair whose receive queue holds only
``net.unix.max_dgram_qlen`` datagrams (often 10); a burst of new serving connections or
shared-memory clients fills it between two turns of the inference role's loop. What the
socket does not take now waits here, with copies of its descriptors, and goes out when the
socket is writable again (an event-loop writer), in the order it was sent. Hand-overs
("direct") are bounded (MAX_WAITING: a stalled role; each holds descriptors); the shared-memory
areas' "open", "close" and "reset" are not (bounded by the clients themselves).
"""
from __future__ import annotations

import asyncio
import os
import socket
from collections import deque
from dataclasses import replace

import structlog

from rlinkd.daemon.serving import channel

log = structlog.get_logger("collector")
MAX_WAITING = 256  # hand-overs at most waiting here (a stalled role: refused beyond)


class ChannelOutbox:
    """``send`` from the event loop's thread only."""

    def __init__(self, sock: socket.socket, max_waiting: int = MAX_WAITING) -> None:
        self.sock, self.max_waiting = sock, max_waiting
        self.waiting: deque[channel.ChannelMessage] = deque()
        self.watching = self.closed = False

    def send(self, msg: channel.ChannelMessage) -> bool:
        """Send ``msg`` now or once the socket can take it; the caller keeps its descriptors
        (copies travel). False, with nothing taken: a hand-over when ``max_waiting`` of them
        already wait, anything once closed, or no descriptors left for the copies."""
        hand_overs = sum(1 for w in self.waiting if w.op == "direct") if msg.op == "direct" else 0
        if self.closed or hand_overs >= self.max_waiting:
            return False
        copies: list[int] = []
        try:
            for fd in msg.fds:
                copies.append(os.dup(fd))
        except OSError as exc:  # (EMFILE)
            for fd in copies:
                os.close(fd)
            log.warning("area_channel_no_descriptors", op=msg.op, error=str(exc))
            return False
        self.waiting.append(replace(msg, fds=tuple(copies)))
        self.flush()
        return True

    def flush(self) -> None:
        """Send what waits, in order, until the socket is full (then watch it)."""
        while self.waiting:
            msg = self.waiting[0]
            try:
                channel.send(self.sock, msg)
            except BlockingIOError:
                break
            except OSError as exc:  # (not ours to fix: the datagram is dropped, loudly)
                log.error("area_channel_send_failed", op=msg.op, error=str(exc))
            self.waiting.popleft()
            for fd in msg.fds:
                os.close(fd)
        self._watch(bool(self.waiting))

    def close(self) -> None:
        """Drop what waits (its descriptors closed); ``send`` refuses from now on."""
        self.closed = True
        self._watch(False)
        while self.waiting:
            for fd in self.waiting.popleft().fds:
                os.close(fd)

    def _watch(self, on: bool) -> None:
        if on == self.watching:
            return
        loop = asyncio.get_running_loop()
        if on:
            loop.add_writer(self.sock.fileno(), self.flush)
        else:
            loop.remove_writer(self.sock.fileno())
        self.watching = on
