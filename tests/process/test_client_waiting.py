"""`rlinkd client` with no daemon says at once what it waits for and for how long (it used to
print nothing for 120 s, then "gave up reconnecting" although it never connected)."""
from __future__ import annotations

import selectors
import socket
import subprocess
import time

import pytest

from rlinkd.daemon.launch import rlinkd_command

pytestmark = [pytest.mark.process]


def first_stderr_line(proc: subprocess.Popen, timeout_s: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sel.select(timeout=deadline - time.monotonic()):
            return proc.stderr.readline()
    return ""


@pytest.mark.parametrize("where", ["tcp", "shm"])
def test_rlinkd_client_without_a_daemon_says_what_it_waits_for(tmp_path, where):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}" if where == "tcp" else f"shm:{tmp_path}"
    proc = subprocess.Popen(rlinkd_command("client", "--connect", address), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        started = time.monotonic()
        line = first_stderr_line(proc, 60.0)  # (the import of gymnasium takes a while on a loaded host)
        assert line, "nothing said within 60 s"
        assert (str(port) if where == "tcp" else str(tmp_path)) in line, line
        assert "120 s" in line and "gave up" not in line, line
        assert time.monotonic() - started < 60.0
    finally:
        proc.terminate()
        proc.wait(30)
