"""rlinkd.daemon.launch: the one "start rlinkd serve, wait, stop" used by demo, tests, bench."""
from __future__ import annotations

import subprocess
import sys

import pytest

from rlinkd.daemon.launch import LaunchError, ServeProcess, serve_command, stop_processes

pytestmark = pytest.mark.process

IGNORES_SIGTERM = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                   "print('ready', flush=True); time.sleep(120)")


def test_serve_command_uses_an_ephemeral_port_unless_one_is_given(tmp_path):
    assert serve_command(tmp_path)[-2:] == ["--port", "0"]
    given = serve_command(tmp_path, ["--port", "7001", "--fresh"])
    assert given.count("--port") == 1 and given[-3:] == ["--port", "7001", "--fresh"]


def test_stop_processes_kills_what_ignores_sigterm_at_the_deadline():
    stubborn = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE, text=True)
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    assert stubborn.stdout.readline().strip() == "ready"  # its handler is installed
    killed = stop_processes([stubborn, polite], timeout_s=1.0)
    assert killed == [stubborn]
    assert stubborn.returncode == -9 and polite.returncode == -15


def test_start_raises_with_the_log_when_serve_exits_before_ready(tmp_path):
    daemon = ServeProcess(tmp_path / "state", ["--set", "no_such_section.key=1"])
    with pytest.raises(LaunchError, match="exited with 78 before it was ready") as err:
        daemon.start(timeout_s=60)
    assert "no_such_section" in str(err.value)  # the log's tail says why
    assert daemon.proc.poll() is not None and not daemon.stop_timed_out
