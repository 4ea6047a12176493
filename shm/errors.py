"""Error hierarchy of the shm package.

Every failure the package reports on purpose is an ``ShmError``; callers that
only want "shared memory went wrong" catch that one class.
"""

from __future__ import annotations


class ShmError(Exception):
    """Base class of every error raised on purpose by the shm package."""


class LayoutError(ShmError):
    """A segment's header does not match what the attaching side expects.

    Raised by every ``attach``: bad magic, unsupported layout version, wrong
    record size, capacity inconsistent with the file size, and so on.  The
    message names the file and the field that mismatched.
    """


class SegmentOwnerError(ShmError):
    """A segment file belongs to another user or is not a regular file."""


class RingFull(ShmError):
    """A StepRing producer could not write before its deadline (or at once)."""


class ChecksumError(ShmError):
    """A BlobArea payload does not match the sha256 stored beside it."""


class PayloadTooLarge(ShmError):
    """A BlobArea payload exceeds the area's capacity (nothing was written)."""
