"""The collector's sending end of the area channel: datagrams in order, none lost to a full
queue.

The channel is a SOCK_SEQPACKET socketpair whose receive queue holds only
``net.unix.max_dgram_qlen`` datagrams (often 10); a burst of new serving connections or
shared-memory clients fills it between two turns of the inference role's loop. What the
socket does not take now waits here, with copies of its descriptors, and goes out when the
socket is writable again (an event-loop writer), in the order it was sent.
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
MAX_WAITING = 4096  # datagrams at most waiting here (a stalled role: refuse beyond)


class ChannelOutbox:
    """``send`` from the event loop's thread only."""

    def __init__(self, sock: socket.socket, max_waiting: int = MAX_WAITING) -> None:
        self.sock, self.max_waiting = sock, max_waiting
        self.waiting: deque[channel.ChannelMessage] = deque()
        self.watching = False

    def send(self, msg: channel.ChannelMessage) -> bool:
        """Send ``msg`` now or once the socket can take it; the caller keeps its descriptors
        (copies travel). False, with nothing taken, when MAX_WAITING are already waiting."""
        if len(self.waiting) >= self.max_waiting:
            return False
        self.waiting.append(replace(msg, fds=tuple(os.dup(fd) for fd in msg.fds)))
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
        """Drop what waits (its descriptors closed)."""
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
