"""Finding a local daemon: its state directory and ``daemon.json``.

``rlinkd status``, ``rlinkd client --connect shm`` and ``connect("auto")`` all look in
the same place: the state directory (``$STATE_DIRECTORY``, else
``$XDG_STATE_HOME/rlinkd``, else ``~/.local/state/rlinkd``, unless given), whose
``daemon.json`` names the daemon's pid, Unix socket and TCP port.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from rlinkd.client_lib.protocol.addresses import Endpoint

DAEMON_FILE = "daemon.json"


def default_state_dir() -> Path:
    """$STATE_DIRECTORY (systemd), else $XDG_STATE_HOME/rlinkd, else ~/.local/state/rlinkd."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "rlinkd"


def read_daemon_file(state_dir: str | os.PathLike | None = None) -> dict | None:
    """The running daemon's info, or None when absent/unreadable or its pid is gone."""
    path = Path(state_dir or default_state_dir()) / DAEMON_FILE
    try:
        info = json.loads(path.read_text())
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info


def local_socket(state_dir: str | os.PathLike | None = None) -> str | None:
    """The Unix socket of a daemon running on this host, if there is one."""
    info = read_daemon_file(state_dir)
    path = info.get("unix_socket") if info else None
    return path if path and os.path.exists(path) else None


def find_socket(ep: Endpoint) -> str | None:
    """The Unix socket a shared-memory endpoint names (``protocol.addresses``), if a daemon
    is there now: the socket itself, or the one its state dir's ``daemon.json`` names."""
    if ep.kind.endswith("-socket"):
        return ep.path if os.path.exists(ep.path) else None
    return local_socket(ep.path or None)
