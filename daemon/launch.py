"""Run ``rlinkd serve`` as a child process: start it, wait until it is ready, stop it.

The one implementation behind everything that needs a real daemon process: ``rlinkd
demo``, the process tests (``tests.helpers.DaemonProcess`` adds its leftover checks on
top) and the benchmarks (``bench.harness.daemon``).

Contract of ``ServeProcess``:

- ``launch()`` starts ``python -m rlinkd.daemon.cli serve --state-dir S [--port 0] ARGS``
  with this interpreter; stdout and stderr are appended to ``<state_dir>/rlinkd.log``
  (``LOG_FILE``), stdin is /dev/null. It never waits.
- ``start()`` is ``launch()`` + ``wait_ready()``, stopping the daemon when it fails.
- ``wait_ready(timeout_s, until)`` polls every 50 ms until ``daemon.json`` names *this*
  process's pid (a stale file of an earlier daemon is ignored) and, when given,
  ``until(info)`` holds; returns the ``daemon.json`` dict. Raises ``LaunchError`` (with
  the log's tail) as soon as the process exits, or at the deadline.
- ``stop(timeout_s, sig)`` signals the daemon by its pid (SIGTERM by default) and waits;
  at the deadline it SIGKILLs the daemon and every descendant seen just before the
  signal, sets ``stop_timed_out`` and returns. Returns the exit code (negative: killed by
  that signal), None when never launched. A daemon that already exited is not signalled.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from rlinkd.client_lib.protocol.discovery import DAEMON_FILE
from rlinkd.client_lib.transport import RLlinkError
from rlinkd.daemon.errors import RlinkdError
from rlinkd.daemon.runfiles import query_status

LOG_FILE = "rlinkd.log"
"""Where a launched daemon's stdout and stderr go, inside its state directory."""
POLL_S = 0.05


class LaunchError(RlinkdError):
    """The daemon exited before it was ready, or was not ready by the deadline."""


def rlinkd_command(*args: str) -> list[str]:
    """``rlinkd ARGS`` run with this interpreter (any verb: serve, client, demo, ...)."""
    return [sys.executable, "-m", "rlinkd.daemon.cli", *args]


def set_args(overrides: Iterable[str]) -> list[str]:
    """``["--set", o, ...]`` for each ``section.key=value`` override."""
    return [arg for o in overrides for arg in ("--set", o)]


def serve_command(state_dir: Path, args: Sequence[str] = ()) -> list[str]:
    """``rlinkd serve`` on ``state_dir``; on an ephemeral port unless ``args`` name ``--port``."""
    port = [] if "--port" in args else ["--port", "0"]
    return rlinkd_command("serve", "--state-dir", str(state_dir), *port, *args)


def weights_published(info: dict) -> bool:
    """True once the daemon ``info`` names answers STATUS with a policy (weights_seq_no >= 0);
    False while it does not answer. For ``wait_ready(until=...)``."""
    try:
        return query_status(info, timeout_s=5.0).get("weights_seq_no", -1) >= 0
    except (OSError, RLlinkError, ValueError):  # not listening yet, an ERROR reply, a bad frame
        return False


def stop_processes(procs: Iterable[subprocess.Popen], timeout_s: float = 30.0,
                   sig: int = signal.SIGTERM) -> list[subprocess.Popen]:
    """Send ``sig`` to each process still running, wait for all until one shared deadline,
    then SIGKILL and reap the ones still running. Returns those that had to be killed."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
    deadline, killed = time.monotonic() + timeout_s, []
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            killed.append(p)
    return killed


def descendants(pid: int) -> list[int]:
    """Pids of every process below ``pid`` right now ([] when it is gone)."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_pids(pids: Iterable[int]) -> None:
    """SIGKILL each pid (one we started or a descendant of one); already gone is fine."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _environment(extra: dict | None) -> dict:
    """os.environ with ``extra`` applied; a value of None removes that variable."""
    env = dict(os.environ)
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@dataclass
class ServeProcess:
    """``rlinkd serve`` as a child process with its own state directory (contract above)."""

    state_dir: Path
    args: list[str] = field(default_factory=list)
    env: dict | None = None
    """Variables added to (value None: removed from) this process's environment."""
    proc: subprocess.Popen | None = None
    info: dict = field(default_factory=dict)
    stop_timed_out: bool = False

    def launch(self) -> ServeProcess:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(serve_command(self.state_dir, self.args), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=_environment(self.env))
        return self

    def wait_ready(self, timeout_s: float = 120.0,
                   until: Callable[[dict], bool] | None = None) -> dict:
        proc, deadline = self._launched(), time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise LaunchError(f"rlinkd serve exited with {proc.returncode} before it was "
                                  f"ready; {self.log_path}:\n{self.log_tail()}")
            info = self._own_daemon_file()
            if info and (until is None or until(info)):
                self.info = info
                return info
            time.sleep(POLL_S)
        raise LaunchError(f"rlinkd serve not ready after {timeout_s:g} s; {self.log_path}:\n"
                          f"{self.log_tail()}")

    def start(self, timeout_s: float = 120.0,
              until: Callable[[dict], bool] | None = None) -> ServeProcess:
        """``launch()`` then ``wait_ready()``; a daemon that is not ready is stopped before
        the LaunchError propagates (no caller is left with a half-started daemon)."""
        self.launch()
        try:
            self.wait_ready(timeout_s, until)
        except LaunchError:
            self.stop()
            raise
        return self

    def _own_daemon_file(self) -> dict | None:
        try:
            info = json.loads((self.state_dir / DAEMON_FILE).read_text())
        except (FileNotFoundError, json.JSONDecodeError):  # not yet, or mid-replace
            return None
        return info if info.get("pid") == self.pid else None

    def _launched(self) -> subprocess.Popen:
        if self.proc is None:
            raise LaunchError("rlinkd serve has not been launched")
        return self.proc

    @property
    def pid(self) -> int:
        return self._launched().pid

    @property
    def port(self) -> int:
        """The TCP port the daemon listens on (after ``wait_ready``)."""
        return int(self.info["port"])

    @property
    def unix_socket(self) -> str:
        return self.info["unix_socket"]

    @property
    def log_path(self) -> Path:
        return self.state_dir / LOG_FILE

    def log_tail(self, n_chars: int = 4000) -> str:
        """The last ``n_chars`` of the daemon's log ("" when there is none yet)."""
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except FileNotFoundError:
            return ""

    def status(self, timeout_s: float = 10.0) -> dict:
        """The daemon's STATUS report (through client_lib, over its Unix socket)."""
        return query_status(self.info, timeout_s)

    def stop(self, timeout_s: float = 60.0, sig: int = signal.SIGTERM) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            kids = descendants(self.proc.pid)
            if stop_processes([self.proc], timeout_s, sig):
                kill_pids(kids)
                self.stop_timed_out = True
        return self.proc.returncode

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
