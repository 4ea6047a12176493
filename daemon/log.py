"""structlog set-up shared by the supervisor and every child process.

Logs go to stdout: JSON lines when stdout is not a TTY (systemd's journal, files,
pipes), a readable console format otherwise. Every line carries the process role
and pid. ``configure`` is called once per process and again when SIGHUP changes
``daemon.log_level``.
"""
from __future__ import annotations

import logging
import os
import sys
import time

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


def _add_process(role: str):
    pid = os.getpid()

    def processor(_logger, _name, event_dict):
        event_dict.setdefault("role", role)
        event_dict.setdefault("pid", pid)
        return event_dict
    return processor


def configure(level: str = "info", role: str = "supervisor", json: bool | None = None) -> None:
    """Configure structlog for this process (idempotent; safe to call again on reload)."""
    if json is None:
        json = not sys.stdout.isatty()
    renderer = (structlog.processors.JSONRenderer() if json
                else structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars,
                    structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    _add_process(role),
                    structlog.processors.format_exc_info,
                    renderer],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stdout),  # (one write per line:
        # roles share the stream, and a line and its newline written apart could interleave)
        cache_logger_on_first_use=False,
    )


def reload_level(changes: dict, role: str) -> None:
    """Every role calls this on a Reload message: SIGHUP may change ``daemon.log_level``."""
    if "daemon.log_level" in changes:
        configure(changes["daemon.log_level"], role)
        structlog.get_logger(role).warning("log_level_set", log_level=changes["daemon.log_level"])


class RateLimit:
    """At most ``per_s`` log lines a second (token bucket); the rest are counted, and the
    count is reported with the next line that gets through. Hostile clients cannot flood
    the log; every error is still counted (``protocol_errors``, ``direct_errors``)."""

    def __init__(self, per_s: float) -> None:
        self.per_s, self.tokens, self.last = per_s, per_s, time.monotonic()
        self.suppressed = 0

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.per_s, self.tokens + (now - self.last) * self.per_s)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        self.suppressed += 1
        return False

    def take_suppressed(self) -> int:
        n, self.suppressed = self.suppressed, 0
        return n
