"""Process shell shared by every role: signals, logging, exit codes.

Each role module exposes ``run(topo, ctx) -> ExitCode``: a loop around a pure core
that knows nothing of signals. ``child_main`` is the ``spawn`` target: it sets up
logging and signals, imports only that role's module (so the collector and the
connector never import torch), and turns whatever escapes ``run`` into an exit code
— the one place an unexpected exception is caught, logged with its traceback and
translated (``CRASH``: the supervisor restarts the child).
"""
from __future__ import annotations

import ctypes
import faulthandler
import importlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from rlinkd.daemon import log as logsetup
from rlinkd.daemon.errors import ConfigError, ExitCode
from rlinkd.daemon.roster import ROLE_MODULES
from rlinkd.daemon.wiring import Topology


PR_SET_PDEATHSIG = 1
BOOT_TIMEOUT_S = 120.0   # a role still booting after this long stops heart-beating (hung)
BOOT_BEAT_S = 0.5


class BootError(Exception):
    """A role cannot start and restarting will not help (bad device, unusable segment)."""


@dataclass
class RoleContext:
    """What a role's shell gets besides the topology: its name and its stop flag."""

    role: str
    topo: Topology
    stop: threading.Event = field(default_factory=threading.Event)
    booted: threading.Event = field(default_factory=threading.Event)
    in_process: bool = False

    @property
    def inbox(self):
        return self.topo.inboxes[self.role]

    def heartbeat(self) -> None:
        """Called by the role's loop; the first call also ends the boot heartbeat."""
        self.booted.set()
        self.topo.heartbeat(self.role)

    def start_boot_heartbeat(self, timeout_s: float = BOOT_TIMEOUT_S) -> None:
        """Heart-beat from a thread while the role boots (imports torch, loads a
        checkpoint), for at most ``timeout_s``: a role stuck in boot still looks hung."""
        def beat() -> None:
            deadline = time.monotonic() + timeout_s
            while not self.booted.wait(BOOT_BEAT_S) and time.monotonic() < deadline:
                self.topo.heartbeat(self.role)
        self.topo.heartbeat(self.role)
        threading.Thread(target=beat, name="boot-heartbeat", daemon=True).start()

    def send(self, target: str, msg: Any, timeout_s: float | None = 5.0) -> None:
        self.topo.inboxes[target].send(msg, timeout_s)

    def try_send(self, target: str, msg: Any) -> bool:
        return self.topo.inboxes[target].try_send(msg)


def _install_child_signals() -> None:
    """Children obey the supervisor (Stop messages), not signals sent to the group.

    Ctrl-C and ``timeout``/``kill -- -PGID`` signal the whole process group; the
    supervisor alone decides what happens (drain, final checkpoint, then Stop).
    SIGABRT keeps its default action so a hung child can be aborted (faulthandler
    prints every thread's stack first). If the supervisor dies, the kernel kills us.
    """
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    faulthandler.enable()
    _die_with_parent()


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG(SIGKILL): no orphaned role outlives a killed supervisor."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # not Linux-like: the heartbeat timeout still catches an orphan
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os._exit(int(ExitCode.CRASH))


def run_role(role: str, topo: Topology, ctx: RoleContext) -> int:
    """Import the role and run it, translating exceptions to exit codes."""
    log = structlog.get_logger(role)
    try:
        module = importlib.import_module(ROLE_MODULES[role])
        return int(module.run(topo, ctx))
    except (BootError, ConfigError) as exc:
        log.error("boot_error", error=str(exc))
        return int(ExitCode.CONFIG if isinstance(exc, ConfigError) else ExitCode.BOOT_ERROR)
    except Exception:  # the process boundary: log it, exit CRASH, get restarted
        log.exception("role_crashed")
        return int(ExitCode.CRASH)


def child_main(role: str, topo: Topology) -> None:
    """Entry point of a spawned role process; ends it with ``run_role``'s exit code."""
    logsetup.configure(topo.cfg.daemon.log_level, role)
    ctx = RoleContext(role=role, topo=topo)
    _install_child_signals()
    ctx.start_boot_heartbeat()
    _exit_now(run_role(role, topo, ctx))


def _exit_now(code: int) -> None:
    """End the process as soon as the role has returned, without the interpreter's teardown.

    Nothing is left to do by then: inbox sends are synchronous (a sent message is in the
    kernel), log lines are written one ``write`` each, the only other thread is the daemon
    boot heartbeat, and the supervisor unlinks the shared memory. The teardown would only
    free a torch-loaded interpreter's objects one by one: ~0.7 s of the learner's stop.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more to write
            pass
    os._exit(code)
