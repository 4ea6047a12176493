"""Child-process bookkeeping for the supervisor: spawn, reap, back off, detect crash loops.

``Child`` is pure state plus three process operations (start, signal, reap); the
decisions (restart now? crash loop? hung?) are small functions over that state so
they can be tested without processes.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field

from rlinkd.daemon.errors import ExitCode

HEALTHY_AFTER_S = 60.0      # a child alive this long resets its backoff
ABORT_GRACE_S = 5.0         # SIGABRT → SIGKILL after this long


@dataclass
class Child:
    """One role's process across restarts."""

    role: str
    process: mp.process.BaseProcess | None = None
    started_at: float = 0.0
    restarts: int = 0
    crash_times: deque = field(default_factory=lambda: deque(maxlen=64))
    backoff_s: float = 0.0
    restart_at: float | None = None
    abort_sent_at: float | None = None
    last_exit: int | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def sentinel(self) -> int | None:
        return self.process.sentinel if self.alive() else None

    def start(self, target, args: tuple) -> None:
        ctx = mp.get_context("spawn")
        self.process = ctx.Process(target=target, args=args, name=f"rlinkd-{self.role}")
        self.process.start()
        self.started_at = time.monotonic()
        self.restart_at, self.abort_sent_at = None, None

    def reap(self) -> int | None:
        """Exit code if the process has ended (negative: killed by that signal), else None."""
        if self.process is None or self.process.is_alive():
            return None
        self.process.join(0)
        code = self.process.exitcode
        self.process.close()
        self.process = None
        self.last_exit = code
        return code

    def signal(self, sig: int) -> None:
        if self.alive():
            try:
                os.kill(self.process.pid, sig)
            except ProcessLookupError:
                pass


def is_boot_error(code: int | None) -> bool:
    """Exit codes that mean 'restarting will not help'."""
    return code in (ExitCode.BOOT_ERROR, ExitCode.CONFIG)


def schedule_restart(child: Child, now: float, initial_s: float, max_s: float) -> float:
    """Record a crash and return the delay before the restart (exponential backoff)."""
    if child.started_at and now - child.started_at > HEALTHY_AFTER_S:
        child.backoff_s = 0.0
    child.backoff_s = initial_s if child.backoff_s == 0.0 else min(child.backoff_s * 2, max_s)
    child.crash_times.append(now)
    child.restart_at = now + child.backoff_s
    return child.backoff_s


def in_crash_loop(child: Child, now: float, max_restarts: int, window_s: float) -> bool:
    """True when the child crashed more than ``max_restarts`` times within ``window_s``."""
    recent = [t for t in child.crash_times if now - t <= window_s]
    return len(recent) > max_restarts


def hang_action(child: Child, heartbeat_age_s: float, timeout_s: float, now: float) -> int | None:
    """Which signal a silent child should get now: SIGABRT first, SIGKILL after a grace."""
    if not child.alive() or heartbeat_age_s <= timeout_s:
        child.abort_sent_at = None  # healthy (again): a later hang starts with SIGABRT
        return None
    if child.abort_sent_at is None:
        child.abort_sent_at = now
        return signal.SIGABRT
    if now - child.abort_sent_at > ABORT_GRACE_S:
        return signal.SIGKILL
    return None
