"""ReplayBuffer: transitions in shared memory for off-policy learners (DQN, SAC).

The connector appends transitions (one writer); the learner samples them (one reader, any
number in principle). The buffer is made by the wiring, outside both, so a learner restart
keeps it. Capacity is in transitions; observations keep the step layout's native dtypes
(a uint8 image stays uint8).

A transition row (``ReplayLayout.dtype``; obs fields as in ``shm.records``)::

    offset  size  field      type     meaning
    0       4     reward     f32      n-step return  r_t + g r_t+1 + ... + g^(m-1) r_t+m-1
    4       4     discount   f32      g^m, or 0 when the episode terminated within the m steps
    8       8     seq_no     i64      weights version that chose the action (-1: unknown)
    16      4*A   action     f32[A]   action vector (Discrete: one float holding the index)
    o1            obs        fields   s_t                  o1 = 16 + 4A rounded up to 8
    o2            next_obs   fields   s_t+m (bootstrap)    o2 = o1 + obs bytes
                  (pad to a multiple of 8)

so every algorithm's target is ``reward + discount * V(next_obs)``.

Segment layout::

    offset  size  field           type  written by
    0       8     magic           8s    creator  b"RLKREPL1"
    8       4     layout_version  u32   creator  REPLAY_LAYOUT_VERSION
    12      4     row_bytes       u32   creator
    16      8     capacity        u64   creator  rows
    24      4     writer_pid      u32   connector
    28      4     reader_pid      u32   learner
    32      8     claimed         u64   writer   rows ever claimed (written or being written)
    40      8     written         u64   writer   rows ever completely written
    48      4     layout_bytes    u32   creator  L, length of the layout description at 64
    52      12    (pad)
    64      L     layout          creator  ``ReplayLayout.to_json()``, ASCII
    R             rows[capacity]         R = 64 + L rounded up to 64

Row ``p`` (absolute, counting from the first row ever) lives at ``p % capacity``.
Writing k rows: ``claimed += k`` first, then the rows, then ``written = claimed`` (stores
are ordered on x86 TSO). A reader samples absolute positions in
``[max(0, claimed - capacity), written)``, copies them, then reads ``claimed`` again: a
row whose position fell below ``claimed - capacity`` meanwhile may have been overwritten
during the copy and is drawn again. No lock, and the writer never waits for readers.
"""
from __future__ import annotations

import os
import struct

import numpy as np

from rlinkd.shm.errors import LayoutError
from rlinkd.shm.records import DerivedLayout, StepLayout, align
from rlinkd.shm.segment import Segment, check_field, check_magic

REPLAY_MAGIC = b"RLKREPL1"
REPLAY_LAYOUT_VERSION = 1
REPLAY_HEADER = struct.Struct("<8sIIQIIQQI12x")
assert REPLAY_HEADER.size == 64
WRITER_PID_OFFSET, READER_PID_OFFSET = 24, 28
CLAIMED_OFFSET, WRITTEN_OFFSET = 32, 40
MAX_RESAMPLE_ROUNDS = 8


class ReplayLayout(DerivedLayout):
    """The transition row of one policy, derived from its ``StepLayout``."""

    ACTION_OFFSET = 16
    SIZE_KEY, KIND = "row_bytes", "replay"

    def __init__(self, step: StepLayout) -> None:
        super().__init__(step)
        obs_dtype = step.dtype["obs"]
        obs_offset = align(self.ACTION_OFFSET + 4 * self.action_size, 8)
        next_offset = obs_offset + obs_dtype.itemsize
        self.row_bytes = self.record_bytes = align(next_offset + obs_dtype.itemsize, 8)
        self.dtype = np.dtype({
            "names": ["reward", "discount", "seq_no", "action", "obs", "next_obs"],
            "formats": ["<f4", "<f4", "<i8", ("<f4", (self.action_size,)), obs_dtype, obs_dtype],
            "offsets": [0, 4, 8, self.ACTION_OFFSET, obs_offset, next_offset],
            "itemsize": self.row_bytes})

    def segment_bytes(self, capacity: int) -> int:
        return _rows_offset(len(self.description())) + capacity * self.row_bytes

    def empty(self, rows: int) -> np.ndarray:
        return np.zeros(rows, self.dtype)


def _rows_offset(layout_bytes: int) -> int:
    return align(REPLAY_HEADER.size + layout_bytes, 64)


class ReplayBuffer:
    """One mapped replay buffer. ``rows`` is the structured view of every row.

    Made by the wiring (``create``), attached by the connector (writer) and the learner
    (reader), which check magic, version, sizes and layout (``attach``)."""

    def __init__(self, segment: Segment, layout: ReplayLayout, capacity: int) -> None:
        self.segment, self.layout, self.capacity = segment, layout, capacity
        start = _rows_offset(len(layout.description()))
        self.rows = np.ndarray((capacity,), layout.dtype, buffer=segment.buf, offset=start)
        self._counters = segment.buf[CLAIMED_OFFSET:CLAIMED_OFFSET + 16].cast("Q")
        self._pids = segment.buf[WRITER_PID_OFFSET:WRITER_PID_OFFSET + 8].cast("I")

    @classmethod
    def create(cls, path: str, layout: ReplayLayout, capacity: int) -> ReplayBuffer:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"replay capacity must be a positive number of rows, got {capacity!r}")
        segment = Segment.create(path, layout.segment_bytes(capacity))
        desc = layout.description()
        REPLAY_HEADER.pack_into(segment.buf, 0, REPLAY_MAGIC, REPLAY_LAYOUT_VERSION, layout.row_bytes,
                                capacity, os.getpid(), 0, 0, 0, len(desc))
        segment.buf[REPLAY_HEADER.size:REPLAY_HEADER.size + len(desc)] = desc
        return cls(segment, layout, capacity)

    @classmethod
    def attach(cls, path: str, expected: ReplayLayout | None = None) -> ReplayBuffer:
        return Segment.open_checked(path, lambda seg: cls._checked(seg, expected))

    @classmethod
    def _checked(cls, segment: Segment, expected: ReplayLayout | None) -> ReplayBuffer:
        if segment.size < REPLAY_HEADER.size:
            raise LayoutError(f"{segment.path}: {segment.size} bytes is smaller than a replay header")
        magic, version, row_bytes, capacity, _, _, _, _, layout_bytes = REPLAY_HEADER.unpack_from(segment.buf)
        check_magic(segment.path, magic, REPLAY_MAGIC, "replay buffer")
        check_field(segment.path, "layout_version", version, REPLAY_LAYOUT_VERSION)
        layout = ReplayLayout.read(segment.path, segment.buf, REPLAY_HEADER.size, layout_bytes,
                                   row_bytes, expected)
        if capacity < 1 or layout.segment_bytes(capacity) > segment.size:
            raise LayoutError(f"{segment.path}: {capacity} rows do not fit {segment.size} bytes")
        return cls(segment, layout, capacity)

    def close(self) -> None:
        self.rows = None  # type: ignore[assignment]
        for view in (self._counters, self._pids):
            view.release()
        self.segment.close()

    def set_pid(self, role: str, pid: int) -> None:
        """Record the writing connector (``"writer"``) or the sampling learner (``"reader"``)."""
        self._pids[0 if role == "writer" else 1] = pid

    # ------------------------------------------------------------ counters
    @property
    def written(self) -> int:
        """Rows ever completely written (the writer's progress; it only grows)."""
        return self._counters[1]

    def __len__(self) -> int:
        return min(self.written, self.capacity)

    # ------------------------------------------------------------ writer
    def append(self, rows: np.ndarray) -> None:
        """Append transitions (structured, ``layout.dtype``): the oldest rows are overwritten
        once the buffer is full. Called by the connector, the only writer."""
        if rows.dtype != self.layout.dtype:
            raise ValueError(f"rows have dtype {rows.dtype}, the replay layout is {self.layout.dtype}")
        count, written = len(rows), self._counters[1]
        rows = rows[-self.capacity:]  # (rows that would be overwritten at once are skipped)
        k = len(rows)
        if not k:
            return
        start = written + count - k
        self._counters[0] = written + count  # claimed: readers stop trusting these slots
        first = start % self.capacity
        head = min(k, self.capacity - first)
        self.rows[first:first + head] = rows[:head]
        self.rows[:k - head] = rows[head:]
        self._counters[1] = written + count  # written

    def restore(self, rows: np.ndarray, written: int) -> None:
        """Refill from ``export()`` (a checkpoint): ``rows`` oldest first, ``written`` the
        counter they had. Called before the writer starts; ValueError if they do not fit."""
        if len(rows) > min(written, self.capacity) or rows.dtype != self.layout.dtype:
            raise ValueError(f"{len(rows)} saved rows do not fit this buffer (capacity "
                             f"{self.capacity}, written {written})")
        self._counters[0] = self._counters[1] = written - len(rows)
        self.append(rows)

    # ------------------------------------------------------------ reader
    def export(self) -> tuple[np.ndarray, int]:
        """(every stored row oldest first, a copy; ``written``) for a checkpoint. Rows the
        writer overwrote during the copy are dropped from the front."""
        written = self.written
        lo = max(0, written - self.capacity)
        positions = np.arange(lo, written)
        rows = self.rows[positions % self.capacity]
        claimed = self._counters[0]
        keep = positions >= claimed - self.capacity
        return rows[keep], written

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray | None:
        """``n`` rows drawn uniformly with replacement from what is stored, copied out (the
        writer may overwrite the buffer right after). None while the buffer is empty.
        Called by the learner once per gradient step."""
        claimed, written = self._counters[0], self._counters[1]
        lo = max(0, claimed - self.capacity)
        if written <= lo:
            return None
        positions = rng.integers(lo, written, n)
        out = self.rows[positions % self.capacity]
        for _ in range(MAX_RESAMPLE_ROUNDS):
            stale = positions < self._counters[0] - self.capacity  # maybe overwritten mid-copy
            if not stale.any():
                return out
            claimed, written = self._counters[0], self._counters[1]  # draw those again
            positions[stale] = rng.integers(max(0, claimed - self.capacity), written, int(stale.sum()))
            out[stale] = self.rows[positions[stale] % self.capacity]
            positions[~stale] = written  # copied while intact: never stale again
        raise RuntimeError("the replay writer laps the reader: capacity too small for its rate")
