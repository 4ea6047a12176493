"""systemd notification protocol, spoken directly (no libsystemd).

A notification is one datagram of newline-separated ``KEY=VALUE`` lines sent to the
AF_UNIX socket named by ``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract
namespace). Outside systemd (no variable) every call is a no-op.
"""
from __future__ import annotations

import os
import socket
import time


class Notifier:
    """Sends READY/STATUS/WATCHDOG/STOPPING/RELOADING. Errors are swallowed only as
    ``ConnectionError``/``OSError`` *counted* in ``failures`` (systemd gone must not
    kill the daemon)."""

    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):
            address = "\0" + address[1:]
        self.address = address
        self.failures = 0
        self._sock = None
        if address:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, **fields: object) -> bool:
        """Send one notification, e.g. ``send(READY=1, STATUS="listening")``."""
        if self._sock is None:
            return False
        # a newline inside a value would inject extra KEY=VALUE lines
        text = "\n".join(f"{k}={str(v).replace(chr(10), ' ')}" for k, v in fields.items())
        payload = text.encode()
        try:
            self._sock.sendto(payload, self.address)
            return True
        except OSError:
            self.failures += 1
            return False

    def ready(self, status: str = "") -> bool:
        return self.send(READY=1, STATUS=status) if status else self.send(READY=1)

    def reloading(self) -> bool:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send(RELOADING=1, MONOTONIC_USEC=usec)

    def stopping(self) -> bool:
        return self.send(STOPPING=1)

    def status(self, text: str) -> bool:
        return self.send(STATUS=text)

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval_s() -> float | None:
    """Half of $WATCHDOG_USEC when the watchdog is enabled for this process, else None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2e6 if value > 0 else None  # like sd_watchdog_enabled: 0 or less is invalid
