"""StepRing: a single-producer / single-consumer ring of step records.

The daemon creates every ring (``StepRing.create``) and consumes it; one
client process attaches (``StepRing.attach``) and produces.  Unread data is
never overwritten: a full ring makes the producer fail (``RingFull``) or
wait, never the consumer lose records.

Sleep/wake-up works both ways, each with its own eventfd doorbell: a consumer
with nothing to read announces ``reader_sleeping`` and sleeps on ``doorbell``
(the producer rings it after publishing); a producer facing a full ring
announces ``writer_waiting`` and sleeps on ``space_doorbell`` (the consumer
rings it after freeing space).  Either doorbell may be None: that side then
polls with backoff.

Segment layout: ``RING_HEADER``, the step layout's description, then
``capacity`` records of ``record_bytes`` (see ``shm.records``)::

    offset  size  field            type  written by
    0       8     magic            8s    creator   b"RLKRING1"
    8       4     layout_version   u32   creator   RING_LAYOUT_VERSION (header + record format)
    12      4     record_bytes     u32   creator
    16      8     capacity         u64   creator   records, a power of two
    24      4     writer_pid       u32   producer  (creator's pid until a producer attaches)
    28      4     reader_pid       u32   consumer  (creator's pid until a consumer attaches)
    32      4     layout_bytes     u32   creator   L, length of the layout description at 320
    36      28    (pad to cache line)
    64      8     tail             u64   producer  records ever written
    72      56    (pad: tail owns its cache line)
    128     8     head             u64   consumer  records ever consumed
    136     56    (pad)
    192     4     reader_sleeping  u32   consumer sets before sleeping; whoever wakes it clears
    196     60    (pad)
    256     4     closed           u32   producer  1 = no more data will come
    260     4     writer_waiting   u32   producer sets before waiting for space; whoever wakes it clears
    264     56    (pad)
    320     L     layout           creator   ``layout_description(layout)``: the StepLayout's JSON
                                             (obs fields with dtypes and shapes, action and dist
                                             sizes, record_bytes), compact, sorted keys, ASCII
    R             records[capacity]      R = ``records_offset(layout)`` = 320 + L rounded up to 64;
                                         record i lives at slot i & (capacity - 1)

``tail - head`` is the number of unread records: 0 = empty, capacity = full.
The u64 counters never wrap in practice (584 years at 1e9 records/s).
See ``shm._sync`` for the memory-ordering argument.
"""

from __future__ import annotations

import json
import os
import struct
import time

import numpy as np

from rlinkd.shm._stepwriter import compile_step_writer
from rlinkd.shm._sync import backoff_until, spin_until, store_load_fence
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.errors import LayoutError, RingFull, ShmError
from rlinkd.shm.records import StepLayout
from rlinkd.shm.segment import Segment, check_field, check_magic, check_writer_pid

RING_MAGIC = b"RLKRING1"
RING_LAYOUT_VERSION = 3  # 2: writer_waiting; 3: full layout description (obs dtypes/shapes) replaces 3 sizes
RING_HEADER = struct.Struct("<8sIIQIII28xQ56xQ56xI60xII56x")
WRITER_PID_OFFSET, READER_PID_OFFSET = 24, 28
TAIL_OFFSET, HEAD_OFFSET, SLEEPING_OFFSET, CLOSED_OFFSET, WAITING_OFFSET = 64, 128, 192, 256, 260
_ROLE_PID_OFFSETS = {"producer": WRITER_PID_OFFSET, "consumer": READER_PID_OFFSET, "observer": None}
HEADER_BYTES = RING_HEADER.size
"""Fixed header; the layout description follows at this offset."""
assert HEADER_BYTES == 320
MAX_LAYOUT_BYTES = 1 << 16
"""Longest layout description ``attach`` accepts (256 fields with long names fit easily)."""

MAX_SLEEP_SLICE_S = 0.1
"""Longest single doorbell wait (either side): bounds a lost wake-up even with timeout None."""


def layout_description(layout: StepLayout) -> bytes:
    """The bytes a ring header stores at ``HEADER_BYTES``: canonical JSON of ``layout.to_json()``."""
    return json.dumps(layout.to_json(), sort_keys=True, separators=(",", ":")).encode("ascii")


def records_offset(layout: StepLayout) -> int:
    """Offset of record 0 in a ring of this layout (64-aligned, after the layout description)."""
    return (HEADER_BYTES + len(layout_description(layout)) + 63) & ~63


def _write_step_after_close(*args, **kwargs):
    raise ShmError("StepRing is closed")


class StepRing:
    """One SPSC ring.  Producer and consumer methods may live in different processes.

    Not thread-safe: one thread produces, one (possibly other) thread consumes.

    ``write_step(flags, obs, action, reward, logp=None, dist=None, weights_seq_no=-1) -> None``
    is the producer's single-step path (an instance attribute built per layout
    by ``shm._stepwriter``; call it once per env step).  action / dist:
    sequences or 1-D numpy arrays of the layout's sizes (a plain number for a
    1-float action).  obs: for a flat layout (one float32 field, the generated
    fast path) a sequence or numpy array of its values; for any other layout a
    mapping {field name: array of the field's shape}, or, for a single field,
    that array -- copied in the field's dtype (``StepLayout.write_obs``: uint8
    stays uint8).  Sets HAS_LOGP / HAS_DIST when ``logp`` / ``dist`` are
    given; ``flags`` carries the rest.  Publishes the record at once and rings
    the doorbell if the consumer sleeps.  Raises ``RingFull`` at once, writing
    nothing, when the ring is full (see ``wait_writable``) and ``ValueError``
    for wrong sizes, shapes, keys or values that do not fit a field (nothing
    is published then).
    """

    def __init__(self, segment: Segment, layout: StepLayout, doorbell: Doorbell | None,
                 space_doorbell: Doorbell | None = None) -> None:
        self.segment = segment
        self.path = segment.path
        self.layout = layout
        self.records_offset = records_offset(layout)
        self.capacity = (segment.size - self.records_offset) // layout.record_bytes
        self.doorbell = doorbell
        """Consumer sleeps on it, producer rings it (None: the consumer polls)."""
        self.space_doorbell = space_doorbell
        """Producer sleeps on it for space, consumer rings it (None: the producer polls).
        Both sides must hold it; a consumer holding it pays one fence per release."""
        self.producer_sleeps = 0
        """How often this producer announced a wait for space (diagnostics, tests)."""
        self.consumer_spin_s = 0.0
        """Busy-poll this long in ``wait_readable`` before sleeping (0 = never)."""
        self.max_sleep_slice_s = MAX_SLEEP_SLICE_S
        """Longest single doorbell wait in ``wait_readable`` (bounds a lost wake-up)."""
        buf = segment.buf
        self._tail = buf[TAIL_OFFSET:TAIL_OFFSET + 8].cast("Q")
        self._head = buf[HEAD_OFFSET:HEAD_OFFSET + 8].cast("Q")
        self._sleeping = buf[SLEEPING_OFFSET:SLEEPING_OFFSET + 4].cast("I")
        self._closed = buf[CLOSED_OFFSET:CLOSED_OFFSET + 4].cast("I")
        self._waiting = buf[WAITING_OFFSET:WAITING_OFFSET + 4].cast("I")
        records_area = np.frombuffer(buf, np.uint8, self.capacity * layout.record_bytes, self.records_offset)
        self._raw = records_area.reshape(self.capacity, layout.record_bytes)
        self._no_records = np.empty(0, layout.dtype)
        bind = compile_step_writer(layout)
        self.write_step = bind(layout.struct.pack_into, segment.mapping, self.records_offset, layout.record_bytes,
                               self.capacity, self._tail, self._head, self._sleeping, self._wake_reader,
                               self.__repr__)

    # ------------------------------------------------------------ lifecycle

    @classmethod
    def create(cls, path: str, layout: StepLayout, capacity_records: int, doorbell: Doorbell | None = None,
               mode: int = 0o600, space_doorbell: Doorbell | None = None) -> StepRing:
        """Create an empty ring file at ``path`` (daemon side).  ``capacity_records``: a power of two."""
        segment = Segment.create(path, ring_bytes(layout, capacity_records), mode)
        return cls(_format(segment, layout, capacity_records), layout, doorbell, space_doorbell)

    @classmethod
    def create_sealed(cls, name: str, layout: StepLayout, capacity_records: int) -> StepRing:
        """Create an empty ring in a sealed memfd (``Segment.create_sealed``): for a producer
        we do not trust to keep its size.  The collector calls it on ATTACH and passes
        ``ring.segment.fd`` to the client, which maps it with ``attach_fd``."""
        segment = Segment.create_sealed(name, ring_bytes(layout, capacity_records))
        return cls(_format(segment, layout, capacity_records), layout, None)

    @classmethod
    def attach(cls, path: str, expected_layout: StepLayout | None = None, doorbell: Doorbell | None = None,
               role: str = "producer", space_doorbell: Doorbell | None = None) -> StepRing:
        """Map an existing ring after checking every header field (``LayoutError``).

        ``role`` ("producer", "consumer" or "observer") decides whether our pid
        is recorded as writer_pid / reader_pid (informational only).
        """
        return cls._adopt(Segment.attach(path), expected_layout, doorbell, role, space_doorbell)

    @classmethod
    def attach_fd(cls, fd: int, name: str, expected_layout: StepLayout | None = None,
                  doorbell: Doorbell | None = None, role: str = "producer") -> StepRing:
        """Map a sealed ring received as ``fd`` (``Segment.from_fd``: takes ownership of ``fd``,
        refuses it without size seals), then check its header like ``attach``."""
        return cls._adopt(Segment.from_fd(fd, name), expected_layout, doorbell, role, None)

    @classmethod
    def _adopt(cls, segment: Segment, expected_layout: StepLayout | None, doorbell: Doorbell | None,
               role: str, space_doorbell: Doorbell | None) -> StepRing:
        """Check a freshly mapped segment's header and record our pid; closes it on failure."""
        try:
            _check_role(role)
            layout = _check_header(segment, expected_layout)
        except BaseException:
            segment.close()
            raise
        pid_offset = _ROLE_PID_OFFSETS[role]
        if pid_offset is not None:
            segment.buf[pid_offset:pid_offset + 4] = os.getpid().to_bytes(4, "little")
        return cls(segment, layout, doorbell, space_doorbell)

    def close(self) -> None:
        """Drop this process's mapping (idempotent)."""
        self.write_step = _write_step_after_close
        if not self.segment.closed:  # the views must go before the mapping can be unmapped
            del self._tail, self._head, self._sleeping, self._closed, self._waiting, self._raw
        self.segment.close()

    def unlink(self) -> None:
        """Remove the file name (idempotent); mapped peers are unaffected."""
        self.segment.unlink()

    def header(self) -> dict:
        """Decoded header fields (diagnostics)."""
        fields = RING_HEADER.unpack_from(self.segment.buf, 0)
        names = ("magic", "layout_version", "record_bytes", "capacity", "writer_pid", "reader_pid",
                 "layout_bytes", "tail", "head", "reader_sleeping", "closed",
                 "writer_waiting")
        return dict(zip(names, fields))

    def __repr__(self) -> str:
        return f"StepRing({self.path!r}, capacity={self.capacity}, {self.layout})"

    # ------------------------------------------------------------ producer

    def free_records(self) -> int:
        """Records the producer can write right now."""
        return self.capacity - (self._tail[0] - self._head[0])

    def write_batch(self, records: np.ndarray, timeout_s: float | None = None) -> int:
        """Append ``records`` (an array of ``layout.dtype``); returns how many were written.

        ``timeout_s`` None: write what fits now (possibly 0) and return the
        count.  Otherwise all-or-nothing: wait (``wait_writable``) until the
        whole batch fits, raising ``RingFull`` at the
        deadline.  One or two slice copies, one tail publication.
        """
        raw = self._raw_rows(records)
        count = len(raw)
        if timeout_s is not None and count > self.capacity:
            raise ValueError(f"batch of {count} records can never fit in {self!r}")
        if timeout_s is not None and not self.wait_writable(count, timeout_s):
            raise RingFull(f"{self!r}: {count} records did not fit within {timeout_s}s "
                           f"({self.free_records()} free)")
        tail = self._tail[0]
        count = min(count, self.capacity - (tail - self._head[0]))
        if count > 0:
            self._copy_in(raw[:count], tail)
            self._publish_tail(tail + count)
        return count

    def wait_writable(self, n_records: int = 1, timeout_s: float | None = None) -> bool:
        """Wait until ``n_records`` fit; False at the deadline.

        With a ``space_doorbell``: announce ``writer_waiting`` (``arm_space_wait``),
        sleep on the doorbell in slices of at most ``max_sleep_slice_s`` (a lost
        wake-up costs latency, never a hang).  Without one: spin, then backoff sleeps.
        """
        if n_records > self.capacity:
            raise ValueError(f"{n_records} records can never fit in {self!r}")
        if self.space_doorbell is None:
            return backoff_until(lambda: self.free_records() >= n_records, timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.free_records() < n_records:
            remaining = self.max_sleep_slice_s if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return False
            if not self.arm_space_wait(n_records):
                self.space_doorbell.wait(min(remaining, self.max_sleep_slice_s))
            self.disarm_space_wait()
        return True

    def arm_space_wait(self, n_records: int = 1) -> bool:
        """Producer, before sleeping on ``space_doorbell``: set ``writer_waiting``, fence, re-check.

        Returns True if ``n_records`` fit meanwhile (then do not sleep).  Either way
        call ``disarm_space_wait`` after (not) sleeping.  An event-loop producer awaits
        the doorbell's fd instead of ``Doorbell.wait`` (bound it to ``max_sleep_slice_s``).
        """
        self._waiting[0] = 1
        store_load_fence()
        if self.free_records() >= n_records:
            return True
        self.producer_sleeps += 1
        return False

    def disarm_space_wait(self) -> None:
        """Producer, after waking: clear ``writer_waiting`` and drain the doorbell."""
        self._waiting[0] = 0
        if self.space_doorbell is not None:
            self.space_doorbell.drain()

    def mark_closed(self) -> None:
        """Producer: no more records will follow; wakes a sleeping consumer."""
        self._closed[0] = 1
        store_load_fence()
        if self._sleeping[0]:
            self._wake_reader()

    def _raw_rows(self, records: np.ndarray) -> np.ndarray:
        if not isinstance(records, np.ndarray) or records.dtype != self.layout.dtype or records.ndim != 1:
            raise TypeError(f"write_batch needs a 1-D array of {self.layout} dtype, got "
                            f"{getattr(records, 'dtype', type(records))!r}")
        return np.ascontiguousarray(records).view(np.uint8).reshape(len(records), self.layout.record_bytes)

    def _copy_in(self, raw: np.ndarray, tail: int) -> None:
        start = tail & (self.capacity - 1)
        first = min(len(raw), self.capacity - start)
        self._raw[start:start + first] = raw[:first]
        if first < len(raw):
            self._raw[:len(raw) - first] = raw[first:]

    def _publish_tail(self, new_tail: int) -> None:
        self._tail[0] = new_tail
        store_load_fence()
        if self._sleeping[0]:
            self._wake_reader()

    def _wake_reader(self) -> None:
        """Producer side, only when the consumer announced it is sleeping."""
        if self.doorbell is not None:
            self._sleeping[0] = 0
            self.doorbell.ring()

    # ------------------------------------------------------------ consumer

    def readable_records(self) -> int:
        """Records the consumer can read right now."""
        return self._tail[0] - self._head[0]

    def is_closed(self) -> bool:
        """True once the producer called ``mark_closed`` (records may still be unread)."""
        return self._closed[0] != 0

    def read_batch(self, max_records: int) -> np.ndarray:
        """Copy out up to ``max_records`` records (contiguous array, possibly empty) and consume them."""
        head = self._head[0]
        count = max(0, min(max_records, self._tail[0] - head, self.capacity))
        if count == 0:
            return self._no_records
        out = np.empty(count, self.layout.dtype)
        start = head & (self.capacity - 1)
        first = min(count, self.capacity - start)
        out_raw = out.view(np.uint8).reshape(count, self.layout.record_bytes)
        out_raw[:first] = self._raw[start:start + first]
        if first < count:
            out_raw[first:] = self._raw[:count - first]
        self._release(head + count)
        return out

    def _release(self, new_head: int) -> None:
        """Consumer: publish ``head``; wake a producer that announced it waits for space."""
        self._head[0] = new_head
        if self.space_doorbell is not None:
            store_load_fence()
            if self._waiting[0]:
                self._waiting[0] = 0
                self.space_doorbell.ring()

    def _has_news(self) -> bool:
        return self._tail[0] != self._head[0] or self._closed[0] != 0

    def wait_readable(self, timeout_s: float | None) -> bool:
        """Block until records are readable or the ring is closed; False at the deadline.

        Protocol: optional spin (``consumer_spin_s``), then set
        ``reader_sleeping``, full fence, re-check (lost-wake-up guard), sleep
        on the doorbell.  Each sleep lasts at most ``max_sleep_slice_s`` so a
        missed ring (see ``shm._sync``) or a producer without the doorbell
        costs latency, never a hang.  Without a doorbell this polls.
        """
        if self._has_news():
            return True
        if self.doorbell is None:
            return backoff_until(self._has_news, timeout_s)
        if spin_until(self._has_news, self.consumer_spin_s):
            return True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = self.max_sleep_slice_s if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._sleeping[0] = 1
            store_load_fence()
            if not self._has_news():
                self.doorbell.wait(min(remaining, self.max_sleep_slice_s))
            self._sleeping[0] = 0
            if self._has_news():
                return True


def arm_sleep(rings) -> bool:
    """One consumer, many rings sharing one doorbell: announce sleep on all of them.

    Sets ``reader_sleeping`` on every ring, fences, and returns True if any
    ring became readable (or closed) meanwhile -- then do not sleep.  After
    waking (the collector awaits the doorbell fd in its event loop), call
    ``doorbell.drain()`` and ``disarm_sleep`` (so producers stop ringing),
    then read every ring.  Bound the sleep with a timeout of the order of
    ``MAX_SLEEP_SLICE_S`` (see ``shm._sync``).
    """
    for ring in rings:
        ring._sleeping[0] = 1
    store_load_fence()
    return any(ring._has_news() for ring in rings)


def disarm_sleep(rings) -> None:
    """Clear ``reader_sleeping`` on every ring (consumer, after waking)."""
    for ring in rings:
        ring._sleeping[0] = 0


def ring_bytes(layout: StepLayout, capacity_records: int) -> int:
    """Segment size of a ring; ``ValueError`` unless ``capacity_records`` is a power of two."""
    if capacity_records < 1 or capacity_records & (capacity_records - 1):
        raise ValueError(f"ring capacity must be a power of two, got {capacity_records}")
    return records_offset(layout) + capacity_records * layout.record_bytes


def _format(segment: Segment, layout: StepLayout, capacity_records: int) -> Segment:
    """Write a new ring's header into a zero-filled segment (magic last: a half-made header
    never looks valid); returns the segment."""
    pid = os.getpid()
    description = layout_description(layout)
    RING_HEADER.pack_into(segment.buf, 0, b"\0" * 8, RING_LAYOUT_VERSION, layout.record_bytes,
                          capacity_records, pid, pid, len(description), 0, 0, 0, 0, 0)
    segment.buf[HEADER_BYTES:HEADER_BYTES + len(description)] = description
    segment.buf[0:8] = RING_MAGIC
    return segment


def _check_role(role: str) -> None:
    if role not in _ROLE_PID_OFFSETS:
        raise ValueError(f"role must be producer, consumer or observer, got {role!r}")


def _check_header(segment: Segment, expected: StepLayout | None) -> StepLayout:
    """Validate every creator-written header field; returns the ring's layout."""
    path, size = segment.path, segment.size
    if size < HEADER_BYTES:
        raise LayoutError(f"{path} is {size} bytes, smaller than a ring header ({HEADER_BYTES})")
    (magic, version, record_bytes, capacity, writer_pid, _reader_pid,
     layout_bytes) = RING_HEADER.unpack_from(segment.buf, 0)[:7]
    check_magic(path, magic, RING_MAGIC, "step ring")
    check_field(path, "layout_version", version, RING_LAYOUT_VERSION)
    check_writer_pid(path, writer_pid)
    if capacity < 1 or capacity & (capacity - 1):
        raise LayoutError(f"capacity {capacity} in {path} is not a power of two")
    layout = _read_layout(segment, layout_bytes)
    check_field(path, "record_bytes", record_bytes, layout.record_bytes)
    check_field(path, "file size (records offset + capacity * record_bytes)", size,
                records_offset(layout) + capacity * record_bytes)
    if expected is not None and layout != expected:
        raise LayoutError(f"step layout mismatch in {path}: {_layout_difference(layout, expected)}")
    return layout


def _read_layout(segment: Segment, length: int) -> StepLayout:
    """The layout description at ``HEADER_BYTES``; LayoutError unless it is canonical valid JSON."""
    path = segment.path
    if not 0 < length <= min(MAX_LAYOUT_BYTES, segment.size - HEADER_BYTES):
        raise LayoutError(f"layout_bytes {length} in {path} out of range (1..{MAX_LAYOUT_BYTES}, within the file)")
    raw = bytes(segment.buf[HEADER_BYTES:HEADER_BYTES + length])
    try:
        layout = StepLayout.from_json(json.loads(raw.decode("ascii")))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise LayoutError(f"bad step layout description in {path}: {exc}") from exc
    if layout_description(layout) != raw:
        raise LayoutError(f"step layout description in {path} is not in canonical form")
    return layout


def _layout_difference(found: StepLayout, expected: StepLayout) -> str:
    """First difference between two layouts, for the attach error message."""
    for i, (a, b) in enumerate(zip(found.obs_fields, expected.obs_fields)):
        if a != b:
            return f"obs field {i}: header has {a!r}, expected {b!r}"
    if len(found.obs_fields) != len(expected.obs_fields):
        return (f"header has {len(found.obs_fields)} obs fields, expected {len(expected.obs_fields)} "
                f"({found!r} vs {expected!r})")
    return (f"header has action/dist sizes {(found.action_size, found.dist_size)}, "
            f"expected {(expected.action_size, expected.dist_size)}")
