"""BlobArea: one variable-size byte payload (a checkpoint snapshot) in shared memory.

The learner ``write``s ``torch.save`` bytes; the checkpointer ``read``s them
later without a queue.  One writer; readers verify a sha256 stored beside
the payload and retry while a write is in progress (seqlock).

Segment layout (``BLOB_HEADER``, then the payload area)::

    offset  size      field           type
    0       8         magic           8s   b"RLKBLOB1"
    8       4         layout_version  u32  BLOB_LAYOUT_VERSION
    12      4         (pad)
    16      8         capacity        u64  bytes in the payload area
    24      4         writer_pid      u32  creator, then the process of the latest write
    28      4         (pad)
    32      8         seqlock         u64  odd while a write is in progress;
                                           generation = seqlock // 2 (+1 per write;
                                           an interrupted write also uses one up)
    40      8         payload_len     u64
    48      32        payload_sha256  32s
    80      48        (pad)
    128     capacity  payload

A writer that dies mid-write leaves the seqlock odd and the payload torn:
readers then time out (``ShmError``) until the next complete write.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time

from rlinkd.shm.errors import ChecksumError, LayoutError, PayloadTooLarge, ShmError
from rlinkd.shm.segment import Segment, check_field, check_magic, check_writer_pid

BLOB_MAGIC = b"RLKBLOB1"
BLOB_LAYOUT_VERSION = 1
BLOB_HEADER = struct.Struct("<8sI4xQI4xQQ32s48x")
SEQLOCK_OFFSET = 32
PAYLOAD_OFFSET = BLOB_HEADER.size
assert PAYLOAD_OFFSET == 128

READ_POLL_S = 1e-3


class BlobArea:
    """A mapped blob area; ``write`` from one process, ``read`` from any."""

    def __init__(self, segment: Segment, capacity: int) -> None:
        self.segment = segment
        self.path = segment.path
        self.capacity = capacity
        self._seqlock = segment.buf[SEQLOCK_OFFSET:SEQLOCK_OFFSET + 8].cast("Q")

    @classmethod
    def create(cls, path: str, capacity_bytes: int, mode: int = 0o600) -> BlobArea:
        """Create an empty area (generation 0) able to hold ``capacity_bytes``."""
        if capacity_bytes < 1:
            raise ValueError(f"capacity must be >= 1 byte, got {capacity_bytes}")
        segment = Segment.create(path, PAYLOAD_OFFSET + capacity_bytes, mode)
        BLOB_HEADER.pack_into(segment.buf, 0, b"\0" * 8, BLOB_LAYOUT_VERSION, capacity_bytes, os.getpid(),
                              0, 0, hashlib.sha256(b"").digest())
        segment.buf[0:8] = BLOB_MAGIC  # last: a half-made header never looks valid
        return cls(segment, capacity_bytes)

    @classmethod
    def attach(cls, path: str) -> BlobArea:
        """Map an existing area after checking its header (``LayoutError``)."""
        return Segment.open_checked(path, lambda segment: cls(segment, _check_header(segment)))

    def generation(self) -> int:
        """Generation of the latest complete write (0: nothing written yet)."""
        return self._seqlock[0] // 2

    def write(self, payload: bytes | bytearray | memoryview) -> int:
        """Writer only: replace the payload; returns its generation (1, 2, ...).

        ``PayloadTooLarge`` (nothing changed) if it exceeds the capacity.
        """
        payload = memoryview(payload).cast("B")
        length = payload.nbytes
        if length > self.capacity:
            raise PayloadTooLarge(f"payload of {length} bytes exceeds the {self.capacity}-byte blob area {self.path}")
        sequence = self._seqlock[0]
        sequence += 1 if sequence % 2 == 0 else 2
        self._seqlock[0] = sequence
        self.segment.buf[PAYLOAD_OFFSET:PAYLOAD_OFFSET + length] = payload
        BLOB_HEADER.pack_into(self.segment.buf, 0, BLOB_MAGIC, BLOB_LAYOUT_VERSION, self.capacity, os.getpid(),
                              sequence, length, hashlib.sha256(payload).digest())
        self._seqlock[0] = sequence + 1
        return (sequence + 1) // 2

    def read(self, timeout_s: float = 10.0) -> tuple[int, bytes]:
        """Return (generation, payload) of the latest complete write; (0, b"") before any.

        Waits while a write is in progress, up to ``timeout_s`` (then
        ``ShmError``).  ``ChecksumError`` if a stable payload fails its sha256.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            before = self._seqlock[0]
            if before % 2 == 0:
                length, digest = BLOB_HEADER.unpack_from(self.segment.buf, 0)[5:7]
                payload = bytes(self.segment.buf[PAYLOAD_OFFSET:PAYLOAD_OFFSET + min(length, self.capacity)])
                if self._seqlock[0] == before:
                    return before // 2, _verified(self.path, payload, length, digest)
            if time.monotonic() >= deadline:
                raise ShmError(f"blob area {self.path}: write in progress for over {timeout_s}s "
                               f"(writer pid {self.writer_pid()})")
            time.sleep(READ_POLL_S)

    def writer_pid(self) -> int:
        return BLOB_HEADER.unpack_from(self.segment.buf, 0)[3]

    def close(self) -> None:
        """Drop this process's mapping (idempotent)."""
        if not self.segment.closed:
            del self._seqlock  # the view must go before the mapping can be unmapped
        self.segment.close()

    def unlink(self) -> None:
        self.segment.unlink()

    def __repr__(self) -> str:
        return f"BlobArea({self.path!r}, capacity={self.capacity})"


def _verified(path: str, payload: bytes, length: int, digest: bytes) -> bytes:
    if length != len(payload) or hashlib.sha256(payload).digest() != digest:
        raise ChecksumError(f"blob area {path}: payload of {length} bytes does not match its sha256")
    return payload


def _check_header(segment: Segment) -> int:
    """Validate the creator-written header; returns the capacity."""
    path, size = segment.path, segment.size
    if size < PAYLOAD_OFFSET:
        raise LayoutError(f"{path} is {size} bytes, smaller than a blob header ({PAYLOAD_OFFSET})")
    magic, version, capacity, writer_pid = BLOB_HEADER.unpack_from(segment.buf, 0)[:4]
    check_magic(path, magic, BLOB_MAGIC, "blob area")
    check_field(path, "layout_version", version, BLOB_LAYOUT_VERSION)
    check_writer_pid(path, writer_pid)
    check_field(path, "file size (header + capacity)", size, PAYLOAD_OFFSET + capacity)
    return capacity
