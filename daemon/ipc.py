"""Inboxes between the daemon's processes: typed messages over SOCK_SEQPACKET.

Why not ``multiprocessing.Queue``: a Queue's reader holds a process-shared lock
while it blocks in ``get()``, so a SIGKILLed learner would leave the lock taken
and its restarted successor could never read again; Queues also pickle. An
``Inbox`` is an AF_UNIX SOCK_SEQPACKET socketpair made once by the wiring: every
sender shares the sending end, the one receiver reads the other end. The kernel
keeps message boundaries, a killed process cannot leave anything half-written or
locked, buffered messages survive a receiver restart (the supervisor holds both
ends), and the kernel buffer bounds memory (a full inbox makes ``send`` wait).

Messages are frozen dataclasses registered with ``@message``, encoded with orjson
(``{"kind": name, ...fields}``). Control traffic only: bulk arrays travel in
shared memory (``shm``), never through an inbox.
"""
from __future__ import annotations

import dataclasses
import os
import select
import socket
import time
from typing import Any, Callable, TypeVar

import orjson

INBOX_BUFFER_BYTES = 1 << 20
_REGISTRY: dict[str, type] = {}
T = TypeVar("T")


class InboxFull(TimeoutError):
    """The receiver has not drained its inbox within the send timeout."""


def message(cls: T) -> T:
    """Class decorator: make ``cls`` a frozen dataclass usable as an inbox message."""
    dc = dataclasses.dataclass(frozen=True)(cls)
    _REGISTRY[cls.__name__] = dc
    return dc


def encode(msg: Any) -> bytes:
    body = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
    body["kind"] = type(msg).__name__
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def decode(data: bytes) -> Any:
    body = orjson.loads(data)
    cls = _REGISTRY[body.pop("kind")]
    return cls(**body)


class Inbox:
    """One receiver's mailbox. Picklable into ``spawn``ed children (fds are passed).

    ``send`` may be called from any process; ``recv``/``drain`` only by the owner.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._rx, self._tx = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for sock in (self._rx, self._tx):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, INBOX_BUFFER_BYTES)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, INBOX_BUFFER_BYTES)

    def fileno(self) -> int:
        """The receiving end, for select/poll/asyncio ``add_reader``."""
        return self._rx.fileno()

    def send(self, msg: Any, timeout_s: float | None = 5.0) -> None:
        """Deliver ``msg``; waits while the inbox is full, raises InboxFull at the deadline.

        Never sets O_NONBLOCK (the fd is shared by several processes); uses MSG_DONTWAIT.
        """
        data = encode(msg)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                self._tx.send(data, socket.MSG_DONTWAIT)
                return
            except BlockingIOError:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise InboxFull(f"inbox {self.name} is full") from None
                select.select([], [self._tx], [], min(remaining or 0.1, 0.1))

    def try_send(self, msg: Any) -> bool:
        """Deliver without waiting; False when the inbox is full (for droppable stats)."""
        try:
            self.send(msg, timeout_s=0)
            return True
        except InboxFull:
            return False

    def recv(self, timeout_s: float | None = None) -> Any | None:
        """Next message, or None when none arrives within ``timeout_s``."""
        if timeout_s is not None:
            ready, _, _ = select.select([self._rx], [], [], max(timeout_s, 0.0))
            if not ready:
                return None
        try:
            data = self._rx.recv(INBOX_BUFFER_BYTES, 0 if timeout_s is None else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        return decode(data)

    def drain(self) -> list[Any]:
        """Every message waiting now (non-blocking)."""
        out = []
        while (msg := self.recv(0)) is not None:
            out.append(msg)
        return out

    def close(self) -> None:
        self._rx.close()
        self._tx.close()


class SharedFd:
    """A plain file descriptor (e.g. an eventfd) that ``spawn`` passes to children."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction
        return (_rebuild_shared_fd, (reduction.DupFd(self.fd),))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _rebuild_shared_fd(dup) -> SharedFd:
    return SharedFd(dup.detach())


def dispatch(handlers: dict[type, Callable[[Any], Any]], msg: Any) -> Any:
    """Call the handler registered for ``type(msg)``; unknown kinds are a bug (KeyError)."""
    return handlers[type(msg)](msg)
