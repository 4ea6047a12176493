"""WeightsBoard: the learner publishes flat float32 policy weights, many readers copy them.

Single writer (the learner), any number of readers; readers never block the
writer and never see a torn set.  Double buffer + seqlock: the writer fills
the inactive buffer while readers copy the active one, then flips.

Segment layout (``BOARD_HEADER``, then the spec area, then two buffers)::

    offset  size    field              type
    0       8       magic              8s   b"RLKBOARD"
    8       4       layout_version     u32  BOARD_LAYOUT_VERSION
    12      4       spec_json_len      u32  bytes used in the spec area
    16      8       n_params           u64  capacity: float32 count per buffer
    24      4       writer_pid         u32
    28      36      (pad to cache line)
    64      8       seqlock            u64  odd while a publish is in progress
    72      4       active             u32  index (0/1) of the buffer readers copy
    76      4       (pad)
    80      8       buffer_seq_no[0]   i64  weights_seq_no held by buffer 0, -1 = none
    88      8       buffer_seq_no[1]   i64
    96      32      (pad)
    128     16384   spec_json          UTF-8 JSON (e.g. network architecture)
    16512   S       buffer 0           f32[n_params], S = 4*n_params rounded up to 64
    16512+S S       buffer 1

Read consistency (x86 TSO, see ``shm._sync``): publish k stores seqlock
2k+1, writes buffer k%2, stores its seq_no, flips ``active``, stores 2k+2.
A reader that loaded seqlock s1 and then ``active`` copied a buffer nobody
rewrote unless the seqlock has since passed ``(s1 & ~1) + 2``.
"""

from __future__ import annotations

import json
import os
import struct
import time

import numpy as np

from rlinkd.shm.errors import LayoutError
from rlinkd.shm.segment import Segment, check_field, check_magic, check_writer_pid

BOARD_MAGIC = b"RLKBOARD"
BOARD_LAYOUT_VERSION = 1
BOARD_HEADER = struct.Struct("<8sIIQI36xQI4xqq32x")
SEQLOCK_OFFSET, ACTIVE_OFFSET, BUFFER_SEQ_OFFSET = 64, 72, 80
SPEC_OFFSET = BOARD_HEADER.size
SPEC_CAPACITY = 16384
BUFFERS_OFFSET = SPEC_OFFSET + SPEC_CAPACITY
assert SPEC_OFFSET == 128

READ_RETRIES_BEFORE_YIELD = 8


def _buffer_stride(n_params: int) -> int:
    return (4 * n_params + 63) & ~63


class WeightsBoard:
    """A mapped weights board; ``publish`` from the learner, ``read`` from anyone."""

    def __init__(self, segment: Segment, n_params: int) -> None:
        self.segment = segment
        self.path = segment.path
        self.n_params = n_params
        buf = segment.buf
        self._seqlock = buf[SEQLOCK_OFFSET:SEQLOCK_OFFSET + 8].cast("Q")
        self._active = buf[ACTIVE_OFFSET:ACTIVE_OFFSET + 4].cast("I")
        self._buffer_seq = buf[BUFFER_SEQ_OFFSET:BUFFER_SEQ_OFFSET + 16].cast("q")
        stride = _buffer_stride(n_params)
        self._buffers = tuple(
            np.frombuffer(buf, np.float32, n_params, BUFFERS_OFFSET + i * stride) for i in (0, 1)
        )

    @classmethod
    def create(cls, path: str, n_params: int, spec_json: bytes, mode: int = 0o600) -> WeightsBoard:
        """Create an empty board (learner or daemon).  ``spec_json`` must be UTF-8 JSON <= 16 KiB."""
        if n_params < 1:
            raise ValueError(f"n_params must be >= 1, got {n_params}")
        _check_spec_json(spec_json)
        segment = Segment.create(path, BUFFERS_OFFSET + 2 * _buffer_stride(n_params), mode)
        BOARD_HEADER.pack_into(segment.buf, 0, b"\0" * 8, BOARD_LAYOUT_VERSION, len(spec_json), n_params,
                               os.getpid(), 0, 0, -1, -1)
        segment.buf[SPEC_OFFSET:SPEC_OFFSET + len(spec_json)] = spec_json
        segment.buf[0:8] = BOARD_MAGIC  # last: a half-made header never looks valid
        return cls(segment, n_params)

    @classmethod
    def attach(cls, path: str) -> WeightsBoard:
        """Map an existing board after checking its header (``LayoutError``)."""
        return Segment.open_checked(path, lambda segment: cls(segment, _check_header(segment)))

    def publish(self, weights_seq_no: int, flat: np.ndarray) -> None:
        """Writer only (one process): make ``flat`` (n_params float32 values) the current weights.

        Never waits for readers.  A writer that died mid-publish leaves the
        seqlock odd; the next publish skips to the following odd value.
        """
        flat = np.asarray(flat).reshape(-1)
        if flat.size != self.n_params:
            raise ValueError(f"publish got {flat.size} params, board {self.path} holds {self.n_params}")
        sequence = self._seqlock[0]
        sequence += 1 if sequence % 2 == 0 else 2
        inactive = 1 - self._active[0]
        self._seqlock[0] = sequence
        np.copyto(self._buffers[inactive], flat, casting="same_kind")
        self._buffer_seq[inactive] = weights_seq_no
        self._active[0] = inactive
        self._seqlock[0] = sequence + 1

    def read(self, out: np.ndarray | None = None) -> tuple[int, np.ndarray]:
        """Copy the current weights into ``out`` (allocated if None); returns (weights_seq_no, out).

        Retries until the copy is consistent (yields the CPU after a few
        failed tries).  Before the first publish returns (-1, zeros).
        """
        if out is None:
            out = np.empty(self.n_params, np.float32)
        elif out.shape != (self.n_params,) or out.dtype != np.float32:
            raise ValueError(f"out must be float32[{self.n_params}], got {out.dtype}{list(out.shape)}")
        attempts = 0
        while True:
            before = self._seqlock[0]
            active = self._active[0]
            np.copyto(out, self._buffers[active])
            seq_no = self._buffer_seq[active]
            if self._seqlock[0] <= (before & ~1) + 2:
                return seq_no, out
            attempts += 1
            if attempts % READ_RETRIES_BEFORE_YIELD == 0:
                time.sleep(0)

    def latest_seq_no(self) -> int:
        """weights_seq_no of the current weights, -1 before the first publish."""
        while True:
            before = self._seqlock[0]
            seq_no = self._buffer_seq[self._active[0]]
            if self._seqlock[0] <= (before & ~1) + 2:
                return seq_no

    def spec_json(self) -> bytes:
        """The JSON bytes given at create time."""
        length = BOARD_HEADER.unpack_from(self.segment.buf, 0)[2]
        return bytes(self.segment.buf[SPEC_OFFSET:SPEC_OFFSET + length])

    def close(self) -> None:
        """Drop this process's mapping (idempotent)."""
        if not self.segment.closed:  # the views must go before the mapping can be unmapped
            del self._seqlock, self._active, self._buffer_seq, self._buffers
        self.segment.close()

    def unlink(self) -> None:
        self.segment.unlink()

    def __repr__(self) -> str:
        return f"WeightsBoard({self.path!r}, n_params={self.n_params})"


def _check_spec_json(spec_json: bytes) -> None:
    if not isinstance(spec_json, (bytes, bytearray)):
        raise TypeError(f"spec_json must be bytes, got {type(spec_json).__name__}")
    if len(spec_json) > SPEC_CAPACITY:
        raise ValueError(f"spec_json is {len(spec_json)} bytes, the board holds at most {SPEC_CAPACITY}")
    try:
        json.loads(spec_json.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"spec_json is not UTF-8 JSON: {exc}") from exc


def _check_header(segment: Segment) -> int:
    """Validate the creator-written header; returns n_params."""
    path, size = segment.path, segment.size
    if size < BUFFERS_OFFSET:
        raise LayoutError(f"{path} is {size} bytes, smaller than a weights board header ({BUFFERS_OFFSET})")
    magic, version, spec_len, n_params, writer_pid, _, active = BOARD_HEADER.unpack_from(segment.buf, 0)[:7]
    check_magic(path, magic, BOARD_MAGIC, "weights board")
    check_field(path, "layout_version", version, BOARD_LAYOUT_VERSION)
    check_writer_pid(path, writer_pid)
    if spec_len > SPEC_CAPACITY:
        raise LayoutError(f"spec_json_len {spec_len} in {path} exceeds the spec area ({SPEC_CAPACITY})")
    if active not in (0, 1):
        raise LayoutError(f"active buffer index {active} in {path} is not 0 or 1")
    if n_params < 1:
        raise LayoutError(f"n_params {n_params} in {path} must be >= 1")
    check_field(path, "file size (header + spec + 2 buffers)", size, BUFFERS_OFFSET + 2 * _buffer_stride(n_params))
    return n_params
