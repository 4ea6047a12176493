"""An eventfd used to wake one sleeping consumer across processes.

The daemon creates one ``Doorbell`` per consumer and its roles inherit the fd
at spawn (shared-memory clients ring a FIFO wrapped in a ``Doorbell`` instead,
see ``daemon.collector.shm_server``); a producer rings it only when the consumer has
announced that it is going to sleep (see ``StepRing``), so the syscall is
off the hot path.  The counter semantics of eventfd make rings idempotent:
any number of rings before a ``drain`` wake the waiter once.
"""

from __future__ import annotations

import math
import os
import select

from rlinkd.shm.errors import ShmError

_EVENTFD_WORD = (1).to_bytes(8, "little")


class Doorbell:
    """Non-blocking eventfd; ``ring`` from producers, ``wait``/``drain`` from the consumer."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)

    @classmethod
    def create(cls) -> Doorbell:
        return cls(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))

    @classmethod
    def from_fd(cls, fd: int) -> Doorbell:
        """Wrap an eventfd received from another process (SCM_RIGHTS); takes ownership of ``fd``.

        ``ShmError`` if ``fd`` is not an eventfd (e.g. fds mixed up in transit).
        """
        kind = os.readlink(f"/proc/self/fd/{fd}")
        if kind != "anon_inode:[eventfd]":
            raise ShmError(f"fd {fd} is {kind!r}, not an eventfd doorbell")
        os.set_blocking(fd, False)
        return cls(fd)

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError("doorbell is closed")
        return self._fd

    def ring(self) -> None:
        """Add 1 to the counter (one syscall).  A saturated counter already wakes the waiter."""
        try:
            os.write(self._fd, _EVENTFD_WORD)
        except BlockingIOError:
            pass  # counter at its maximum: the waiter is woken anyway

    def drain(self) -> int:
        """Reset the counter without blocking; returns how many rings were pending."""
        total = 0
        while True:
            try:
                total += int.from_bytes(os.read(self._fd, 8), "little")
            except BlockingIOError:
                return total

    def wait(self, timeout_s: float | None) -> bool:
        """Block up to ``timeout_s`` (None: forever) for a ring, then drain.

        Returns True if the doorbell had been rung.  EINTR is retried by Python
        (PEP 475) with the remaining timeout.
        """
        timeout_ms = None if timeout_s is None else max(0, math.ceil(timeout_s * 1000.0))
        if not self._poller.poll(timeout_ms):
            return False
        return self.drain() > 0

    def close(self) -> None:
        """Close the fd; idempotent."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            del self._poller
            os.close(fd)

    def __enter__(self) -> Doorbell:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Doorbell(fd={self._fd})"
