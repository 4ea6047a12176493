"""Inboxes between the daemon's processes: typed messages over SOCK_SEQPACKET.

Why not ``multiprocessing.Queue``: a Queue's reader holds a process-shared lock
while it blocks in ``get()``, so a SIGKILLed learner would leave the lock taken
and its restarted successor could never read again; Queues also pickle. An
``Inbox`` is an AF_UNIX SOCK_SEQPACKET socketpair made once by the wiring: every
sender shares the sending end, the one receiver reads the other end. The kernel
keeps message boundaries, a killed process cannot leave anything half-written or
locked, buffered messages survive a receiver restart (the supervisor holds both
ends), and the kernel buffer bounds memory (a full inbox makes ``send`` wait).

Messages are frozen dataclasses registered with ``@message(to=...)``: the receiving
inboxes are part of the declaration, ``Inbox.send`` refuses a message addressed
elsewhere, and each role dispatches with one ``messages.Router`` that must handle or
explicitly ignore every message addressed to it. Fields are typed (scalars, ``X | None``,
``tuple[X, ...]``, ``dict[str, X]`` and nested frozen dataclasses); ``decode`` checks each
field against its annotation, so a malformed message fails loudly at the receiver
(``BadMessage``) instead of travelling on as a wrong value. Encoded with orjson
(``{"kind": name, ...fields}``). Control traffic only: bulk arrays travel in shared
memory (``shm``), never through an inbox.
"""
from __future__ import annotations

import dataclasses
import os
import select
import socket
import time
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import orjson

from rlinkd.daemon.errors import RlinkdError

INBOX_BUFFER_BYTES = 1 << 20
_REGISTRY: dict[str, type] = {}
T = TypeVar("T")


class InboxError(RlinkdError):
    """Base of inbox failures."""


class InboxFull(InboxError, TimeoutError):
    """The receiver has not drained its inbox within the send timeout."""


class BadMessage(InboxError):
    """Bytes from an inbox that do not decode into a declared message (a bug: the roles
    share these declarations). The receiving role crashes and is restarted."""


class Misrouted(InboxError):
    """A message sent to, or dispatched by, a role it is not addressed to (a bug)."""


def message(*, to: tuple[str, ...] | str) -> Callable[[type[T]], type[T]]:
    """Class decorator over a ``@dataclass(frozen=True)``: register it as an inbox message
    that may be sent to the inboxes named ``to``. TypeError for anything else."""
    receivers = frozenset((to,) if isinstance(to, str) else to)

    def register(cls: type[T]) -> type[T]:
        params = getattr(cls, "__dataclass_params__", None)
        if params is None or not params.frozen:
            raise TypeError(f"{cls.__name__}: an inbox message must be a frozen dataclass")
        cls.RECEIVERS = receivers  # type: ignore[attr-defined]
        _REGISTRY[cls.__name__] = cls
        return cls
    return register


def registered() -> dict[str, type]:
    """Every declared message class by name (for routers and tests)."""
    return dict(_REGISTRY)


def encode(msg: Any) -> bytes:
    body = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
    body["kind"] = type(msg).__name__
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def decode(data: bytes) -> Any:
    """The message in ``data``; BadMessage for unknown kinds, missing, extra or mistyped fields."""
    try:
        body = orjson.loads(data)
        cls = _REGISTRY[body.pop("kind")]
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise BadMessage(f"undecodable inbox message: {exc!r}") from None
    return _build(cls, body, cls.__name__)


def _build(cls: type, body: Any, path: str) -> Any:
    """``cls(**body)`` with every field checked (and nested payloads built) from its hints."""
    if not isinstance(body, dict):
        raise BadMessage(f"{path}: expected an object, got {type(body).__name__}")
    hints = _hints(cls)
    if set(body) != set(hints):
        raise BadMessage(f"{path}: fields {sorted(body)}, declared {sorted(hints)}")
    fields = {k: _check(body[k], hint, f"{path}.{k}") for k, hint in hints.items()}
    try:
        return cls(**fields)
    except RlinkdError as exc:  # a declaration's own check (__post_init__) refused it
        raise BadMessage(f"{path}: {exc}") from None


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        resolved = typing.get_type_hints(cls)
        _HINTS[cls] = {f.name: resolved[f.name] for f in dataclasses.fields(cls)}
    return _HINTS[cls]


def _check(value: Any, hint: Any, path: str) -> Any:
    """``value`` converted to ``hint`` (lists to tuples, ints to floats), or BadMessage."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return _first_fit(value, [a for a in args if a is not type(None)], path)
    if origin is tuple and isinstance(value, (list, tuple)):
        return tuple(_check(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict and isinstance(value, dict):
        return {_check(k, args[0], path): _check(v, args[1], f"{path}[{k!r}]")
                for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value, path)
    return _scalar(value, hint, path)


def _first_fit(value: Any, options: list[Any], path: str) -> Any:
    """``value`` as the first union member it fits (members are tried in declared order)."""
    for option in options:
        try:
            return _check(value, option, path)
        except BadMessage:
            continue
    raise BadMessage(f"{path}: {value!r} fits none of {options}")


def _scalar(value: Any, hint: Any, path: str) -> Any:
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint in (int, str, bool) and type(value) is hint:
        return value
    raise BadMessage(f"{path}: {value!r} is not {getattr(hint, '__name__', hint)}")


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
        Raises Misrouted when ``msg`` is not addressed to this inbox.
        """
        if self.name not in getattr(type(msg), "RECEIVERS", ()):
            raise Misrouted(f"{type(msg).__name__} is not addressed to inbox {self.name!r}")
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
