"""Files a running daemon keeps in its state directory.

- ``rlinkd.lock``: flock'ed for the daemon's lifetime; a second daemon on the same
  state directory refuses to start.
- ``daemon.json``: pid, Unix socket, TCP address; how ``rlinkd status``, ``client
  --connect shm``, ``checkpoint`` and ``reload`` find the running daemon. Written
  atomically once listening, removed at exit.

``query_status`` asks the daemon a ``daemon.json`` names for its status (CLI, demo, bench).
"""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from rlinkd.client_lib.protocol.discovery import DAEMON_FILE, read_daemon_file
from rlinkd.daemon.errors import ConfigError

LOCK_FILE = "rlinkd.lock"


class StateDirLock:
    """Exclusive lock on a state directory (released by the kernel if we die)."""

    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = state_dir / LOCK_FILE
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            other = read_daemon_file(state_dir) or {}
            raise ConfigError(f"another rlinkd (pid {other.get('pid', '?')}) is running with "
                              f"state_dir {state_dir}") from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{os.getpid()}\n".encode())

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def write_daemon_file(state_dir: Path, info: dict) -> None:
    tmp = state_dir / f".{DAEMON_FILE}.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, state_dir / DAEMON_FILE)


def remove_daemon_file(state_dir: Path) -> None:
    (state_dir / DAEMON_FILE).unlink(missing_ok=True)


def query_status(info: dict, timeout_s: float = 10.0) -> dict:
    """STATUS over the Unix socket named in ``info`` (a ``daemon.json``); the token comes
    from ``RLINKD_TOKEN``. Raises OSError/ConnectionError when the daemon does not answer."""
    from rlinkd.client_lib.transport import RLlinkClient
    with RLlinkClient(f"unix://{info['unix_socket']}", timeout_s=timeout_s) as client:
        return client.status(os.environ.get("RLINKD_TOKEN"))
