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


class UnknownPolicyError(RlinkdError):
    """A command names a policy the daemon does not have (``rlinkd export --policy``)."""


class ExportError(RlinkdError):
    """An exported file cannot be written (bad output path, no permission, disk full)."""


class ExitCode(enum.IntEnum):
    """Exit codes of the supervisor and of every child process.

    The supervisor restarts a child that exits with ``CRASH`` (or is killed by a
    signal); ``BOOT_ERROR`` and ``CONFIG`` mean "restarting will not help" and stop
    the restart loop, so the daemon exits non-zero instead of crash-looping. The
    offline commands (``rlinkd export``) use the sysexits.h codes for their input
    (``NO_INPUT``: no checkpoint, or one that does not verify) and output
    (``CANT_CREATE``); a bad request is ``USAGE``, as for argparse's own errors.
    """

    OK = 0
    CRASH = 1
    USAGE = 2
    BOOT_ERROR = 3
    CRASH_LOOP = 4
    NOT_RUNNING = 5
    TIMEOUT = 6
    NO_INPUT = 66  # EX_NOINPUT from sysexits.h
    CANT_CREATE = 73  # EX_CANTCREAT
    CONFIG = 78  # EX_CONFIG from sysexits.h
