"""The daemon's error hierarchy and process exit codes.

Errors are raised where something goes wrong and translated only at boundaries:
a bad frame becomes an ERROR reply to that one client (collector), an exception
escaping a role becomes that process's exit code (``daemon.roles.child_main``),
a bad config file becomes a ``ConfigError`` message and ``ExitCode.CONFIG``.
"""
from __future__ import annotations

import enum


class RlinkdError(Exception):
    """Base of every error the daemon raises on purpose."""


class ConfigError(RlinkdError):
    """The configuration (file, CLI or reload) is invalid. The message names the key."""


class CheckpointError(RlinkdError):
    """A checkpoint could not be written, or one on disk does not verify."""


class ExitCode(enum.IntEnum):
    """Exit codes of the supervisor and of every child process.

    The supervisor restarts a child that exits with ``CRASH`` (or is killed by a
    signal); ``BOOT_ERROR`` and ``CONFIG`` mean "restarting will not help" and stop
    the restart loop, so the daemon exits non-zero instead of crash-looping.
    """

    OK = 0
    CRASH = 1
    USAGE = 2
    BOOT_ERROR = 3
    CRASH_LOOP = 4
    NOT_RUNNING = 5
    TIMEOUT = 6
    CONFIG = 78  # EX_CONFIG from sysexits.h
