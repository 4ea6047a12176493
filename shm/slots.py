"""BatchSlots: fixed slots of column arrays handed from the connector to the learner.

The connector fills a slot's columns in place and marks it READY; the
learner takes the oldest READY slot, trains on the arrays (zero-copy views)
and releases it.  Only slot indices travel over queues.

State machine of one slot, and the ONLY role that performs each transition::

    FREE --acquire_free--> FILLING --mark_ready--> READY --take_ready--> TRAINING --release--> FREE
               connector    |          connector            learner                 learner
                            +--reset_filling (connector restart)--> FREE

FREE and FILLING slots are owned by the connector, READY and TRAINING slots
by the learner; a role writes a slot's header only while owning it, so no
two processes ever store to the same slot header at once and no
compare-and-swap is needed.  A transition stores rows/batch_seq/meta first
and the state last (stores are ordered on x86 TSO), so whoever sees the new
state also sees its data.  Slots left in TRAINING by a killed learner are
listed by ``in_training`` for its successor to redo or release.

Segment header (``SLOTS_HEADER``)::

    offset  size  field           type
    0       8     magic           8s   b"RLKSLOTS"
    8       4     layout_version  u32
    12      4     n_slots         u32
    16      8     capacity_rows   u64  rows per slot
    24      4     writer_pid      u32
    28      4     desc_json_len   u32
    32      8     next_batch_seq  u64  connector-owned counter for mark_ready
    40      24    (pad)
    64      J     description     UTF-8 JSON {"columns": [[name, shape, dtype.str]...],
                                  "meta_fields": [...], "n_slots": .., "capacity_rows": ..};
                                  area of J = desc_json_len rounded up to 64
    64+J    128*n slot headers    SLOT_HEADER each
    ...     n*T   slot data       per slot, each column (capacity_rows, *shape) in order,
                                  each starting 64-byte aligned; T = slot stride

Slot header (``SLOT_HEADER``, 128 bytes)::

    0       4     state           u32  FREE=0 FILLING=1 READY=2 TRAINING=3
    4       4     (pad)
    8       8     rows            u64  valid rows (<= capacity_rows)
    16      8     batch_seq       u64  order of mark_ready calls
    24      64    meta            i64[8], names from meta_fields
    88      40    (pad)
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from rlinkd.shm.errors import LayoutError, ShmError
from rlinkd.shm.segment import Segment, check_field, check_magic, check_writer_pid

SLOTS_MAGIC = b"RLKSLOTS"
SLOTS_LAYOUT_VERSION = 1
SLOTS_HEADER = struct.Struct("<8sIIQIIQ24x")
SLOT_HEADER = struct.Struct("<I4xQQ8q40x")
NEXT_BATCH_SEQ_OFFSET = 32
MAX_META_FIELDS = 8
FREE, FILLING, READY, TRAINING = 0, 1, 2, 3
STATE_NAMES = ("FREE", "FILLING", "READY", "TRAINING")
assert SLOTS_HEADER.size == 64 and SLOT_HEADER.size == 128


def _align64(n: int) -> int:
    return (n + 63) & ~63


class _Geometry:
    """Byte offsets derived from the description (same on create and attach)."""

    def __init__(self, description: dict, desc_len: int) -> None:
        self.n_slots = description["n_slots"]
        self.capacity_rows = description["capacity_rows"]
        self.columns = [(name, tuple(shape), np.dtype(dtype)) for name, shape, dtype in description["columns"]]
        self.meta_fields = list(description["meta_fields"])
        self.slot_headers_offset = SLOTS_HEADER.size + _align64(desc_len)
        self.column_offsets = []
        offset = 0
        for _, shape, dtype in self.columns:
            self.column_offsets.append(offset)
            offset += _align64(self.capacity_rows * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        self.slot_stride = max(offset, 64)
        self.data_offset = self.slot_headers_offset + SLOT_HEADER.size * self.n_slots
        self.total_bytes = self.data_offset + self.n_slots * self.slot_stride


class BatchSlots:
    """Mapped batch slots; see the module docstring for roles and states."""

    def __init__(self, segment: Segment, geometry: _Geometry) -> None:
        self.segment = segment
        self.path = segment.path
        self.n_slots = geometry.n_slots
        self.capacity_rows = geometry.capacity_rows
        self.meta_fields = geometry.meta_fields
        self._geometry = geometry
        buf = segment.buf
        self._next_seq = buf[NEXT_BATCH_SEQ_OFFSET:NEXT_BATCH_SEQ_OFFSET + 8].cast("Q")
        first = geometry.slot_headers_offset
        self._states = [buf[first + i * 128:first + i * 128 + 4].cast("I") for i in range(self.n_slots)]
        self._column_views = [self._make_views(slot) for slot in range(self.n_slots)]

    def _make_views(self, slot: int) -> dict:
        g = self._geometry
        base = g.data_offset + slot * g.slot_stride
        views = {}
        for (name, shape, dtype), offset in zip(g.columns, g.column_offsets):
            count = self.capacity_rows * int(np.prod(shape, dtype=np.int64))
            flat = np.frombuffer(self.segment.buf, dtype, count, base + offset)
            views[name] = flat.reshape((self.capacity_rows, *shape))
        return views

    @classmethod
    def create(cls, path: str, columns: dict, capacity_rows: int, n_slots: int,
               meta_fields: list[str] | tuple[str, ...] = (), mode: int = 0o600) -> BatchSlots:
        """Create all-FREE slots.  ``columns``: name -> (per-row shape, numpy dtype string)."""
        description = _describe(columns, capacity_rows, n_slots, meta_fields)
        desc_json = json.dumps(description).encode("utf-8")
        geometry = _Geometry(description, len(desc_json))
        segment = Segment.create(path, geometry.total_bytes, mode)
        SLOTS_HEADER.pack_into(segment.buf, 0, b"\0" * 8, SLOTS_LAYOUT_VERSION, n_slots, capacity_rows,
                               os.getpid(), len(desc_json), 0)
        segment.buf[64:64 + len(desc_json)] = desc_json
        segment.buf[0:8] = SLOTS_MAGIC  # last: a half-made header never looks valid
        return cls(segment, geometry)

    @classmethod
    def attach(cls, path: str) -> BatchSlots:
        """Map existing slots after checking header and description (``LayoutError``)."""
        return Segment.open_checked(path, lambda segment: cls(segment, _check_header(segment)))

    # ------------------------------------------------------------ connector role

    def acquire_free(self) -> int | None:
        """Connector: FREE -> FILLING for the lowest free slot; None if all are busy."""
        for slot, state in enumerate(self._states):
            if state[0] == FREE:
                state[0] = FILLING
                return slot
        return None

    def mark_ready(self, slot: int, rows: int, meta: dict[str, int] | None = None) -> int:
        """Connector: FILLING -> READY with ``rows`` valid rows; returns the batch_seq assigned."""
        self._expect(slot, FILLING)
        if not 0 <= rows <= self.capacity_rows:
            raise ValueError(f"rows {rows} outside 0..{self.capacity_rows}")
        unknown = set(meta or {}) - set(self.meta_fields)
        if unknown:
            raise ValueError(f"unknown meta fields {sorted(unknown)}; declared {self.meta_fields}")
        values = [int((meta or {}).get(name, 0)) for name in self.meta_fields]
        values += [0] * (MAX_META_FIELDS - len(values))
        batch_seq = self._next_seq[0]
        SLOT_HEADER.pack_into(self.segment.buf, self._slot_header_offset(slot), FILLING, rows, batch_seq, *values)
        self._next_seq[0] = batch_seq + 1
        self._states[slot][0] = READY
        return batch_seq

    def reset_filling(self) -> list[int]:
        """Restarted connector: FILLING -> FREE for every slot it left half-filled."""
        reset = [slot for slot, state in enumerate(self._states) if state[0] == FILLING]
        for slot in reset:
            self._states[slot][0] = FREE
        return reset

    # ------------------------------------------------------------ learner role

    def take_ready(self) -> int | None:
        """Learner: oldest READY slot (by batch_seq) -> TRAINING; None if none is ready."""
        ready = [slot for slot, state in enumerate(self._states) if state[0] == READY]
        if not ready:
            return None
        slot = min(ready, key=self.batch_seq)
        self._states[slot][0] = TRAINING
        return slot

    def in_training(self) -> list[int]:
        """Slots in TRAINING, oldest first (after a learner crash: redo, then release)."""
        slots = [slot for slot, state in enumerate(self._states) if state[0] == TRAINING]
        return sorted(slots, key=self.batch_seq)

    def release(self, slot: int) -> None:
        """Learner: TRAINING -> FREE once the slot's arrays are no longer read."""
        self._expect(slot, TRAINING)
        self._states[slot][0] = FREE

    # ------------------------------------------------------------ accessors

    def columns(self, slot: int) -> dict[str, np.ndarray]:
        """Zero-copy views name -> array of shape (capacity_rows, *shape) for ``slot``."""
        return self._column_views[slot]

    def state(self, slot: int) -> int:
        return self._states[slot][0]

    def rows(self, slot: int) -> int:
        return self._slot_header(slot)[1]

    def batch_seq(self, slot: int) -> int:
        return self._slot_header(slot)[2]

    def meta(self, slot: int) -> dict[str, int]:
        values = self._slot_header(slot)[3:]
        return dict(zip(self.meta_fields, values))

    def close(self) -> None:
        """Drop this process's mapping (idempotent).  Column views handed out keep it alive."""
        if not self.segment.closed:  # the views must go before the mapping can be unmapped
            del self._next_seq, self._states, self._column_views
        self.segment.close()

    def unlink(self) -> None:
        self.segment.unlink()

    def _slot_header_offset(self, slot: int) -> int:
        if not 0 <= slot < self.n_slots:
            raise IndexError(f"slot {slot} outside 0..{self.n_slots - 1}")
        return self._geometry.slot_headers_offset + slot * SLOT_HEADER.size

    def _slot_header(self, slot: int) -> tuple:
        return SLOT_HEADER.unpack_from(self.segment.buf, self._slot_header_offset(slot))

    def _expect(self, slot: int, state: int) -> None:
        found = self._slot_header(slot)[0]
        if found != state:
            raise ShmError(f"slot {slot} of {self.path} is {STATE_NAMES[found]}, expected {STATE_NAMES[state]}")

    def __repr__(self) -> str:
        return f"BatchSlots({self.path!r}, n_slots={self.n_slots}, capacity_rows={self.capacity_rows})"


def _describe(columns: dict, capacity_rows: int, n_slots: int, meta_fields) -> dict:
    """Validate create() arguments into the JSON description stored in the segment."""
    if capacity_rows < 1 or n_slots < 1 or not columns:
        raise ValueError(f"need >= 1 column, row and slot (got {len(columns)}, {capacity_rows}, {n_slots})")
    if len(meta_fields) > MAX_META_FIELDS or len(set(meta_fields)) != len(meta_fields):
        raise ValueError(f"meta_fields must be <= {MAX_META_FIELDS} distinct names, got {list(meta_fields)}")
    described = []
    for name, (shape, dtype) in columns.items():
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else shape
        if dtype.hasobject or dtype.fields is not None:
            raise ValueError(f"column {name!r}: dtype {dtype} is not a plain numeric dtype")
        described.append([str(name), [int(d) for d in shape], dtype.str])
    return {"columns": described, "meta_fields": [str(f) for f in meta_fields],
            "n_slots": n_slots, "capacity_rows": capacity_rows}


def _check_header(segment: Segment) -> _Geometry:
    path, buf = segment.path, segment.buf
    if segment.size < SLOTS_HEADER.size:
        raise LayoutError(f"{path} is {segment.size} bytes, smaller than a batch slots header")
    magic, version, n_slots, capacity_rows, writer_pid, desc_len, _ = SLOTS_HEADER.unpack_from(buf, 0)
    check_magic(path, magic, SLOTS_MAGIC, "batch slots segment")
    check_field(path, "layout_version", version, SLOTS_LAYOUT_VERSION)
    check_writer_pid(path, writer_pid)
    try:
        description = json.loads(bytes(buf[64:64 + desc_len]).decode("utf-8"))
        geometry = _Geometry(description, desc_len)
    except (ValueError, KeyError, TypeError) as exc:
        raise LayoutError(f"unreadable column description in {path}: {exc}") from exc
    check_field(path, "n_slots (header vs description)", n_slots, geometry.n_slots)
    check_field(path, "capacity_rows (header vs description)", capacity_rows, geometry.capacity_rows)
    check_field(path, "file size", segment.size, geometry.total_bytes)
    return geometry
