"""LaneArea: request/response lanes between action clients and the inference role.

A *lane* carries one agent's episode at a time: the client writes a request (an
observation, the reward of the last action, done flags) and publishes it by bumping
``req_seq``; the inference role answers in the same lane (action, log-prob, weights
version, status) and publishes by setting ``resp_seq = req_seq``. A lane holds at most one
request in flight, so a client with L lanes has at most L requests outstanding (the
bound on what one client can ask of the server). One client process (or the collector, for
its TCP clients) writes requests into an area; the inference role alone writes responses.

Wake-ups, each with its own eventfd and the Dekker handshake of ``shm._sync``:
- request doorbell (one per daemon, shared by every area): the inference role sets
  ``server_sleeping`` in every area header, fences, rescans, then sleeps; a client that
  published a request fences, and if it sees ``server_sleeping`` it clears it and rings;
- response doorbell (one per area): a client about to block sets ``client_waiting``,
  fences, rechecks its lane, then sleeps; the inference role, after publishing responses,
  fences, and rings the area's doorbell only if ``client_waiting`` was set (and clears it).

Segment layout: ``LANE_HEADER``, the layout description, then ``capacity`` lanes from
``lanes_offset``, a page boundary, the file padded to a whole page after them, so the
inference role can map every area's lanes back to back into one array (``shm.lane_region``)::

    offset  size  field            type  written by
    0       8     magic            8s    creator   b"RLKLANE1"
    8       4     layout_version   u32   creator   LANE_LAYOUT_VERSION
    12      4     lane_bytes       u32   creator   a multiple of 64 (a lane owns its cache lines)
    16      4     capacity         u32   creator   lanes
    20      4     writer_pid       u32   client    requests are written by this process
    24      4     reader_pid       u32   inference
    28      4     layout_bytes     u32   creator   L, length of the layout description at 64
    32      4     server_sleeping  u32   inference sets before sleeping; a client that sees it clears it
    36      4     client_waiting   u32   client sets before sleeping; the inference role clears it
    40      8     requests         u64   client    requests ever published
    48      4     lanes_offset     u32   creator   R, where the lanes begin
    52      12    (pad)
    64      L     layout           creator   ``LaneLayout.to_json()`` (the step layout of the policy), ASCII
    R             lanes[capacity]        R = 64 + L rounded up to the page size (LANE_ALIGN)
                  (pad to a page)

One lane (``LaneLayout.dtype``; A action floats, the obs fields as in ``shm.records``)::

    offset  size  field           type     written by
    0       4     req_seq         u32      client     bumped (mod 2**32) to publish a request
    4       4     resp_seq        u32      inference  = req_seq once the response is complete
    8       1     op              u8       client     OP_START, OP_STEP, OP_END, OP_RELEASE
    9       1     flags           u8       client     bit0 TERMINATED, bit1 TRUNCATED, bit2 EVALUATE (with START)
    10      2     group_size      u16      client     requests published together (0: a lone request)
    12      4     reward          f32      client     reward of the last action (STEP, END)
    16      4     status          i32      inference  0 OK, else a STATUS_* code (the lane's episode is over)
    20      4     group           u32      client     id shared by a group (0: none): the inference role
                                                      answers a group in one pass, all or none pending
    24      8     weights_seq_no  i64      inference  the version that chose ``action``
    32      4     logp            f32      inference
    36      4     (pad)
    40      4*A   action          f32[A]   inference  (Discrete: one float holding the index)
    o             obs             fields   client     o = 40 + 4A rounded up to 8; per-field padding as in records
                  (pad to a multiple of 64)
"""
from __future__ import annotations

import math
import mmap
import struct

import numpy as np

from rlinkd.shm._sync import store_load_fence
from rlinkd.shm.errors import LayoutError
from rlinkd.shm.records import DerivedLayout, StepLayout, align
from rlinkd.shm.segment import Segment, check_field, check_magic

LANE_MAGIC = b"RLKLANE1"
LANE_LAYOUT_VERSION = 3  # 2: request groups; 3: lanes_offset, lanes on whole pages
LANE_HEADER = struct.Struct("<8sIIIIIIIIQI12x")
assert LANE_HEADER.size == 64
SLEEPING_OFFSET, WAITING_OFFSET, REQUESTS_OFFSET, LANES_OFFSET_OFFSET = 32, 36, 40, 48
LANE_ALIGN = mmap.PAGESIZE  # lanes start on a page and fill whole pages (mmap offsets are pages)
WRITER_PID_OFFSET, READER_PID_OFFSET = 20, 24
MAX_LANES = 1 << 16
MAX_GROUP = (1 << 16) - 1  # requests in one group (group_size is a u16)

OP_START, OP_STEP, OP_END, OP_RELEASE = 1, 2, 3, 4
"""START: first observation of a new episode -> action. STEP: reward of the last action +
next observation -> action. END: reward + final observation, done flags -> acknowledged.
RELEASE: drop the lane's episode without recording its last step (client reset)."""
TERMINATED, TRUNCATED, EVALUATE = 1, 2, 4

STATUS_OK = 0
STATUS_BAD_OP = 1          # an op that does not fit the lane's state (STEP before START, ...)
STATUS_BAD_OBS = 2         # the observation does not fit the policy's space
STATUS_LOST = 3            # the server lost the lane's episode (inference restarted): START again
STATUS_MESSAGES = {STATUS_BAD_OP: "operation out of order for this lane",
                   STATUS_BAD_OBS: "observation does not fit the observation space",
                   STATUS_LOST: "the daemon lost this episode (restart): start a new one"}


class LaneLayout(DerivedLayout):
    """The lane record of one policy: derived from its ``StepLayout`` (obs fields, action size)."""

    ACTION_OFFSET = 40
    SIZE_KEY, KIND = "lane_bytes", "lane"

    def __init__(self, step: StepLayout) -> None:
        super().__init__(step)
        self.obs_offset = align(self.ACTION_OFFSET + 4 * self.action_size, 8)
        obs_dtype = step.dtype["obs"]
        self.lane_bytes = self.record_bytes = align(self.obs_offset + obs_dtype.itemsize, 64)
        self.dtype = np.dtype({
            "names": ["req_seq", "resp_seq", "op", "flags", "group_size", "reward", "status", "group",
                      "weights_seq_no", "logp", "action", "obs"],
            "formats": ["<u4", "<u4", "u1", "u1", "<u2", "<f4", "<i4", "<u4", "<i8", "<f4",
                        ("<f4", (self.action_size,)), obs_dtype],
            "offsets": [0, 4, 8, 9, 10, 12, 16, 20, 24, 32, self.ACTION_OFFSET, self.obs_offset],
            "itemsize": self.lane_bytes})

    def area_bytes(self, lanes: int) -> int:
        """The file: header and layout, the lanes, padding to a whole page."""
        return lanes_offset(len(self.description())) + align(lanes * self.lane_bytes, LANE_ALIGN)

    def span_lanes(self, lanes: int) -> int:
        """Lanes of address space an area of ``lanes`` takes in a ``LaneRegion``: rounded up
        to a whole number of pages that is also a whole number of lanes."""
        return align(lanes, LANE_ALIGN // math.gcd(self.lane_bytes, LANE_ALIGN))


def lanes_offset(layout_bytes: int) -> int:
    return align(LANE_HEADER.size + layout_bytes, LANE_ALIGN)


class LaneArea:
    """One mapped lane area. ``lanes`` is the structured numpy view of every lane.

    Made by the collector (``create``/``create_sealed``), mapped by one client and by the
    inference role (``attach``/``from_fd``), which check magic, version, sizes and layout.
    ``start`` is where the lanes begin in the file (the header's ``lanes_offset``).
    """

    def __init__(self, segment: Segment, layout: LaneLayout, capacity: int) -> None:
        self.segment, self.layout, self.capacity = segment, layout, capacity
        self.start = start = lanes_offset(len(layout.description()))
        self.lanes = np.ndarray((capacity,), layout.dtype, buffer=segment.buf, offset=start)
        self._words = segment.buf[:64].cast("I")
        self._counter = segment.buf[REQUESTS_OFFSET:REQUESTS_OFFSET + 8].cast("Q")
        self._seq_words = segment.buf[start:start + capacity * layout.lane_bytes].cast("I")
        self._stride = layout.lane_bytes // 4

    # ------------------------------------------------------------ making and attaching
    @classmethod
    def create(cls, path: str, layout: LaneLayout, capacity: int) -> LaneArea:
        """A file-backed area (the collector's own, made by the wiring)."""
        capacity = _check_capacity(capacity)
        return cls._init(Segment.create(path, layout.area_bytes(capacity)), layout, capacity)

    @classmethod
    def create_sealed(cls, name: str, layout: LaneLayout, capacity: int) -> LaneArea:
        """A sealed memfd area for one shared-memory client (fd passed on by SCM_RIGHTS)."""
        capacity = _check_capacity(capacity)
        return cls._init(Segment.create_sealed(name, layout.area_bytes(capacity)), layout, capacity)

    @classmethod
    def _init(cls, segment: Segment, layout: LaneLayout, capacity: int) -> LaneArea:
        desc = layout.description()
        LANE_HEADER.pack_into(segment.buf, 0, LANE_MAGIC, LANE_LAYOUT_VERSION, layout.lane_bytes,
                              capacity, _pid(), _pid(), len(desc), 0, 0, 0,
                              lanes_offset(len(desc)))
        segment.buf[LANE_HEADER.size:LANE_HEADER.size + len(desc)] = desc
        return cls(segment, layout, capacity)

    @classmethod
    def attach(cls, path: str, expected: LaneLayout | None = None) -> LaneArea:
        return Segment.open_checked(path, lambda seg: cls._checked(seg, expected))

    @classmethod
    def from_fd(cls, fd: int, name: str, expected: LaneLayout | None = None) -> LaneArea:
        """Map a sealed area received over a Unix socket; takes ownership of ``fd``."""
        segment = Segment.from_fd(fd, name)
        try:
            return cls._checked(segment, expected)
        except BaseException:
            segment.close()
            raise

    @classmethod
    def _checked(cls, segment: Segment, expected: LaneLayout | None) -> LaneArea:
        if segment.size < LANE_HEADER.size:
            raise LayoutError(f"{segment.path}: {segment.size} bytes is smaller than a lane header")
        magic, version, lane_bytes, capacity, _, _, layout_bytes, _, _, _, start = \
            LANE_HEADER.unpack_from(segment.buf)
        check_magic(segment.path, magic, LANE_MAGIC, "lane area")
        check_field(segment.path, "layout_version", version, LANE_LAYOUT_VERSION)
        check_field(segment.path, "lanes_offset", start, lanes_offset(layout_bytes))
        layout = LaneLayout.read(segment.path, segment.buf, LANE_HEADER.size, layout_bytes,
                                 lane_bytes, expected)
        if (not 0 < capacity <= MAX_LANES or layout.area_bytes(capacity) > segment.size
                or lanes_offset(len(layout.description())) != start):
            raise LayoutError(f"{segment.path}: {capacity} lanes do not fit {segment.size} bytes")
        return cls(segment, layout, capacity)

    def close(self) -> None:
        self.lanes = None  # type: ignore[assignment]
        for view in (self._words, self._counter, self._seq_words):
            view.release()
        self.segment.close()

    # ------------------------------------------------------------ header words
    def set_pid(self, role: str, pid: int) -> None:
        """Record the writing client (``"writer"``) or the inference role (``"reader"``)."""
        self._words[(WRITER_PID_OFFSET if role == "writer" else READER_PID_OFFSET) // 4] = pid

    @property
    def requests(self) -> int:
        return self._counter[0]

    def requests_array(self) -> np.ndarray:
        """The header's requests counter as a one-element u64 array, for native code that
        publishes into this area (it bumps the counter as ``publish`` does). Drop every
        such array before ``close``."""
        return np.ndarray((1,), np.uint64, buffer=self.segment.buf, offset=REQUESTS_OFFSET)

    @property
    def server_sleeping(self) -> bool:
        return bool(self._words[SLEEPING_OFFSET // 4])

    def announce_server_sleep(self) -> None:
        self._words[SLEEPING_OFFSET // 4] = 1

    def take_server_sleeping(self) -> bool:
        """Client side, after publishing: True if the server slept (then ring it)."""
        store_load_fence()
        if self._words[SLEEPING_OFFSET // 4]:
            self._words[SLEEPING_OFFSET // 4] = 0
            return True
        return False

    def announce_client_wait(self) -> None:
        self._words[WAITING_OFFSET // 4] = 1
        store_load_fence()

    def take_client_waiting(self) -> bool:
        """Server side, after publishing responses: True if the client sleeps (ring it)."""
        if self._words[WAITING_OFFSET // 4]:
            self._words[WAITING_OFFSET // 4] = 0
            return True
        return False

    # ------------------------------------------------------------ client side
    def publish(self, lane: int) -> None:
        """Publish the request written into ``lanes[lane]`` (data first, then the seq word)."""
        i = lane * self._stride
        self._seq_words[i] = (self._seq_words[i] + 1) & 0xFFFFFFFF
        self._counter[0] = self._counter[0] + 1

    def publish_group(self, rows: np.ndarray, group: int) -> None:
        """Publish the requests written into lanes ``rows`` (distinct) as one group ``group``:
        the inference role answers them in one pass (group 0: as that many lone requests, in
        no particular order). Data first, then the seq words."""
        lanes = self.lanes
        lanes["group"][rows], lanes["group_size"][rows] = group, len(rows) if group else 0
        seqs = lanes["req_seq"]
        seqs[rows] += np.uint32(1)  # (wraps mod 2**32)
        self._counter[0] = self._counter[0] + len(rows)

    def answered_all(self, rows: np.ndarray) -> bool:
        lanes = self.lanes
        return bool((lanes["req_seq"][rows] == lanes["resp_seq"][rows]).all())

    def answered(self, lane: int) -> bool:
        i = lane * self._stride
        return self._seq_words[i] == self._seq_words[i + 1]

    # ------------------------------------------------------------ server side
    def pending(self) -> np.ndarray:
        """Indices of lanes with a request not yet answered."""
        return np.flatnonzero(self.lanes["req_seq"] != self.lanes["resp_seq"])

    def ready(self) -> tuple[np.ndarray, bool]:
        """(indices of lanes with a request to answer now, whether some group is still
        incomplete): the members of a group count only once all of them are pending."""
        idx = self.pending()
        ready = complete_groups(self.lanes, idx)
        return ready, len(ready) < len(idx)

    def answer(self, lanes: np.ndarray, seqs: np.ndarray) -> None:
        """Publish responses already written into ``lanes`` (``seqs``: their req_seq as read)."""
        self.lanes["resp_seq"][lanes] = seqs


def complete_groups(lanes: np.ndarray, idx: np.ndarray, owner: np.ndarray | None = None) -> np.ndarray:
    """The pending lanes ``idx`` that may be answered: lone requests, and the members of
    groups wholly pending (a group is answered in one pass or not at all). Group ids are
    per area: ``owner`` gives each lane's area when ``lanes`` spans several (``shm.lane_region``)."""
    groups = lanes["group"][idx]
    if not groups.any():
        return idx
    sizes = lanes["group_size"][idx]
    if groups[0] == groups[-1] and (groups == groups[0]).all() and (  # one vector act: fast path
            owner is None or (owner[idx] == owner[idx[0]]).all()):
        return idx if len(idx) >= sizes[0] else idx[:0]
    key = groups.astype(np.int64) if owner is None else (owner[idx] << 32) | groups.astype(np.int64)
    ids, first, counts = np.unique(key, return_index=True, return_counts=True)
    complete = ids[((ids & 0xFFFFFFFF) == 0) | (counts >= sizes[first])]
    return idx[np.isin(key, complete)]


def _check_capacity(capacity: int) -> int:
    if not isinstance(capacity, int) or not 0 < capacity <= MAX_LANES:
        raise ValueError(f"lane capacity must be 1..{MAX_LANES}, got {capacity!r}")
    return capacity


def _pid() -> int:
    import os
    return os.getpid()
