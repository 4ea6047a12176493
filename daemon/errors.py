"""The daemon's error hierarchy and process exit codes.

Errors are raised where something goes wrong and translated only at boundaries:
a bad frame becomes an ERROR reply to that one client (collector), an exception
escaping a role becomes that process's exit code (``daemon.roles.child_main``),
a bad config file becomes a ``ConfigError`` message and ``ExitCode.CONFIG``.
"""
from __future__ import annotations

import enum
import re

from rlinkd.client_lib.protocol import codec


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

    A graceful stop (SIGTERM, SIGINT) that could not finish cleanly says so:
    ``DRAIN_NO_CHECKPOINT`` when the final checkpoint was not written (the state since the
    last one is lost), else ``DRAIN_KILLED`` when a role had to be SIGKILLed at the
    deadline. A stop that began for another reason (boot error, crash loop) keeps that code.
    """

    OK = 0
    CRASH = 1
    USAGE = 2
    BOOT_ERROR = 3
    CRASH_LOOP = 4
    NOT_RUNNING = 5
    TIMEOUT = 6
    NO_INPUT = 66  # EX_NOINPUT from sysexits.h
    DRAIN_KILLED = 70  # EX_SOFTWARE: a role did not stop within daemon.shutdown_timeout_s
    CANT_CREATE = 73  # EX_CANTCREAT
    DRAIN_NO_CHECKPOINT = 74  # EX_IOERR: the final checkpoint of a stop was not written
    CONFIG = 78  # EX_CONFIG from sysexits.h


def error_kind(exc: Exception) -> str:
    """The label a protocol error is counted under: its class name in snake case
    (``FrameTooLarge`` → ``frame_too_large``). The protocol-error classes are a small fixed
    hierarchy (codec, ingest, the collector core), so the set of kinds is too."""
    return _snake(type(exc).__name__)


def protocol_error_kinds() -> list[str]:
    """Every kind ``error_kind`` can give: ``ProtocolError`` and its subclasses, as loaded
    (status lists each with its count, zero included, so a series exists before the first)."""
    kinds, todo = set(), [codec.ProtocolError]
    while todo:
        cls = todo.pop()
        kinds.add(_snake(cls.__name__))
        todo += cls.__subclasses__()
    return sorted(kinds)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
