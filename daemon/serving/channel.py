"""The collector↔inference area channel: a SOCK_SEQPACKET socketpair made by the wiring.

The collector accepts client connections, so it makes each shared-memory action client's lane
area (a sealed memfd) and its response doorbell (an eventfd), hands both to the client, and
announces them to the inference role over this channel with the descriptors attached
(SCM_RIGHTS). One datagram per message, a small JSON object:

    collector -> inference   {"op": "open", "area_id": N, "policy": P, "name": S}   + fds [area, response doorbell]
    collector -> inference   {"op": "close", "area_id": N}     the client went away
    collector -> inference   {"op": "reset"}                   a new collector: forget every client area
    collector -> inference   {"op": "direct", "ready": R}      + fds [socket, prefix?]: a serving connection
                             (its first serving message came; R: it was SERVE_DIRECT, whose reply
                             SERVE_DIRECT_READY the role writes first; prefix: a sealed memfd with
                             the bytes the collector had read of it and not carried out)
    inference -> collector   {"op": "hello"}                   a new inference role: send every open area again
    inference -> collector   {"op": "refuse", "area_id": N}    an area it cannot serve: close that client

Each side's descriptor is non-blocking; a datagram is at most MAX_DATAGRAM bytes. The queue
holds few datagrams (``net.unix.max_dgram_qlen``): the collector sends through
collector/channel_outbox.py, which keeps what does not fit until it does. Messages
that do not parse are a bug of ours (``ChannelError``), never client input.
"""
from __future__ import annotations

import fcntl
import os
import socket
from dataclasses import dataclass

import orjson

from rlinkd.daemon.errors import RlinkdError

MAX_DATAGRAM = 4096
MAX_FDS = 2


class ChannelError(RlinkdError):
    """A malformed channel datagram (a bug: both ends are rlinkd roles)."""


def make_pair() -> tuple[int, int]:
    """(collector end, inference end), both non-blocking and close-on-exec."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        s.setblocking(False)
    return a.detach(), b.detach()


@dataclass(frozen=True)
class ChannelMessage:
    op: str
    area_id: int = -1
    policy: str = ""
    name: str = ""
    fds: tuple[int, ...] = ()
    ready: bool = False


def send(sock: socket.socket, msg: ChannelMessage) -> None:
    """One datagram; ``BlockingIOError`` when the peer's queue is full (the caller decides)."""
    body = orjson.dumps({"op": msg.op, "area_id": msg.area_id, "policy": msg.policy, "name": msg.name,
                         "ready": msg.ready})
    if msg.fds:
        socket.send_fds(sock, [body], list(msg.fds))
    else:
        sock.send(body)


def receive(sock: socket.socket) -> ChannelMessage | None:
    """The next datagram, or None when none is waiting. The caller owns the fds it carries."""
    try:
        data, fds, _flags, _ = socket.recv_fds(sock, MAX_DATAGRAM, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
    except BlockingIOError:
        return None
    if not data:
        raise ChannelError("area channel closed by its peer")
    try:
        obj = orjson.loads(data)
        return ChannelMessage(obj["op"], int(obj["area_id"]), str(obj["policy"]), str(obj["name"]),
                              tuple(fds), bool(obj["ready"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        for fd in fds:
            os.close(fd)
        raise ChannelError(f"bad area channel datagram {data[:80]!r}") from exc


def prefix_fd(data: bytes) -> int:
    """A sealed memfd holding ``data`` (bytes of a connection read before it was handed over:
    any size, unlike a datagram). The caller closes it after sending."""
    fd = os.memfd_create("rlinkd-prefix", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_prefix(fd: int) -> bytes:
    """The bytes of a ``prefix_fd`` (the collector's, so trusted); closes ``fd``."""
    try:
        return os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)
