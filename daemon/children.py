"""Children of the supervisor: restart bookkeeping (pure) and the process handle.

``RoleState`` is one role's restart history and the decisions over it (restart
when? crash loop? hung?) are small functions of that state and the current time, so
``daemon.supervisor_core`` and the tests use them without processes. ``Child`` is
the process handle the shell owns: start, signal, reap — nothing else.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections import deque
from dataclasses import dataclass, field

from rlinkd.daemon.errors import ExitCode

HEALTHY_AFTER_S = 60.0      # a child alive this long resets its backoff
ABORT_GRACE_S = 5.0         # SIGABRT → SIGKILL after this long


@dataclass
class RoleState:
    """One role across restarts, as the supervisor core sees it (no process inside).

    ``running`` is True from the core's ``Start`` decision until the shell reports
    the exit; ``restart_at`` is set while a restart is scheduled.
    """

    role: str
    running: bool = False
    started_at: float = 0.0
    restarts: int = 0
    crash_times: deque = field(default_factory=lambda: deque(maxlen=64))
    backoff_s: float = 0.0
    restart_at: float | None = None
    abort_sent_at: float | None = None
    last_exit: int | None = None

    def mark_started(self, now: float) -> None:
        """A (re)start was decided at ``now``: a fresh process, no pending restart or abort."""
        self.running, self.started_at = True, now
        self.restart_at, self.abort_sent_at = None, None

    def mark_exited(self, code: int) -> None:
        self.running, self.last_exit, self.abort_sent_at = False, code, None


def is_boot_error(code: int | None) -> bool:
    """Exit codes that mean 'restarting will not help'."""
    return code in (ExitCode.BOOT_ERROR, ExitCode.CONFIG)


def schedule_restart(state: RoleState, now: float, initial_s: float, max_s: float) -> float:
    """Record a crash and return the delay before the restart (exponential backoff)."""
    if state.started_at and now - state.started_at > HEALTHY_AFTER_S:
        state.backoff_s = 0.0
    state.backoff_s = initial_s if state.backoff_s == 0.0 else min(state.backoff_s * 2, max_s)
    state.crash_times.append(now)
    state.restart_at = now + state.backoff_s
    return state.backoff_s


def in_crash_loop(state: RoleState, now: float, max_restarts: int, window_s: float) -> bool:
    """True when the role crashed more than ``max_restarts`` times within ``window_s``."""
    recent = [t for t in state.crash_times if now - t <= window_s]
    return len(recent) > max_restarts


def hang_action(state: RoleState, heartbeat_age_s: float, timeout_s: float,
                now: float) -> int | None:
    """Which signal a silent child should get now: SIGABRT first, SIGKILL after a grace."""
    if not state.running or heartbeat_age_s <= timeout_s:
        state.abort_sent_at = None  # healthy (again): a later hang starts with SIGABRT
        return None
    if state.abort_sent_at is None:
        state.abort_sent_at = now
        return signal.SIGABRT
    if now - state.abort_sent_at > ABORT_GRACE_S:
        return signal.SIGKILL
    return None


@dataclass
class Child:
    """One role's current process (the shell's side; decisions live in ``RoleState``)."""

    role: str
    process: mp.process.BaseProcess | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def sentinel(self) -> int | None:
        process = self.process
        return process.sentinel if process is not None and process.is_alive() else None

    def start(self, target, args: tuple) -> None:
        """Spawn ``target(*args)``; raises whatever ``Process.start`` raises (the caller's
        loop boundary turns that into the supervisor's exit)."""
        ctx = mp.get_context("spawn")
        self.process = ctx.Process(target=target, args=args, name=f"rlinkd-{self.role}")
        self.process.start()

    def reap(self) -> int | None:
        """Exit code if the process has ended (negative: killed by that signal), else None."""
        if self.process is None or self.process.is_alive():
            return None
        self.process.join(0)
        code = self.process.exitcode
        self.process.close()
        self.process = None
        return code

    def signal(self, sig: int) -> None:
        """Send ``sig`` if the process is alive; a process that just died is no error."""
        pid = self.pid if self.alive() else None
        if pid is not None:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
