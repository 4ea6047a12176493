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
