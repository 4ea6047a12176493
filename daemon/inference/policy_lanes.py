"""One policy's served lane areas: where they sit in its ``LaneRegion``, the turn's scan for
pending requests, and the response doorbells.

``InferenceServer`` (server.py) owns one ``PolicyLanes`` per policy and, each turn, asks it
which header slots' request counters moved (``snapshot``), which lanes are pending
(``pending``: the native lane scan, native/scan.c, where the extension is built -- one call
for every area looked at; numpy otherwise, a few calls per area) and rings the clients it
answered (``wake``). Not thread-safe; nothing here blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlinkd.daemon.inference.episodes import LaneBook, SlotPool
from rlinkd.daemon.inference.netnative import native_module
from rlinkd.shm._sync import store_load_fence
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.lane_region import MAX_SLOTS, NOWHERE, LaneRegion, Placement
from rlinkd.shm.lanes import REQUESTS_OFFSET, WAITING_OFFSET, LaneArea, LaneLayout

FULL_SCAN_LANES = 512  # numpy: a lane scan looks at every lane when areas moved > 1 + lanes / this
REQUESTS_WORD = REQUESTS_OFFSET // 4  # (the low word of each area's u64 request counter)


@dataclass
class ServedArea:
    """One lane area being served: a shm client's, or the role's own for direct connections."""

    area_id: int
    area: LaneArea
    policy: str
    bell: Doorbell
    where: Placement = NOWHERE  # its lanes and header slot in the policy's region, once added

    def close(self) -> None:
        self.area.close()
        self.bell.close()


class PolicyLanes:
    """Every area of one policy in one ``LaneRegion``: one lane index space, one ``LaneBook``
    over it, and the lanes left pending at the last scan (``deferred``)."""

    def __init__(self, layout: LaneLayout, slots: SlotPool, max_seq_len: int = 0, native: bool = True) -> None:
        self.region = LaneRegion(layout)
        self.book = LaneBook(0, layout.step, slots, max_seq_len)
        self.deferred = np.zeros(0, bool)
        self.any_deferred = False
        self.by_slot: dict[int, ServedArea] = {}
        self.seen = np.zeros(0, np.uint32)  # every area's request counter at the last scan
        fields = layout.dtype.fields
        assert fields is not None
        self.seq_at = (fields["req_seq"][1], fields["resp_seq"][1])
        self.scan = (native_module().pending_lanes if native and native_module() is not None
                     else None)  # (None: numpy; ``native``: the ``scan`` part is on)
        self.slot_start = np.zeros(MAX_SLOTS, np.int64)  # per header slot: its area's first lane
        self.slot_lanes = np.zeros(MAX_SLOTS, np.int64)  # ... and its own lanes (0: no area)
        self.placed = np.zeros(0, np.int64)              # slots with an area, in lane order
        self.found = np.zeros(0, np.int64)               # the native scan's output

    def snapshot(self) -> np.ndarray | None:
        """Before a scan: the request counters it covers (a writer bumps its area's counter
        after the request's seq word, so a request counted here is seen by the scan).
        Returns the header slots whose counter moved since the last snapshot (None when
        areas came or went since: scan them all)."""
        now = self.region.headers[:, REQUESTS_WORD].copy()
        moved = np.flatnonzero(now != self.seen) if len(now) == len(self.seen) else None
        self.seen = now
        return moved

    def published_since(self) -> bool:
        """Some area published a request since the last ``snapshot``: O(areas), not
        O(lanes) like ``pending`` (a hint for spinning: a writer that did not count its
        request is still found by the next scan)."""
        now = self.region.headers[:, REQUESTS_WORD]
        return len(now) != len(self.seen) or bool((now != self.seen).any())

    def place(self, fd: int, served: ServedArea) -> None:
        """``ShmError`` if the region refuses it (the book still matches the region)."""
        try:
            served.where = where = self.region.place(fd, served.area)
            self.by_slot[where.slot] = served
            self._areas_moved(where.slot, where.start, where.served)
        finally:
            high = self.region.high
            self.book.grow(high)
            if len(self.deferred) < high:
                self.deferred = np.concatenate([self.deferred, np.zeros(high - len(self.deferred), bool)])

    def drop(self, served: ServedArea) -> None:
        """Unmap an area (its episodes were closed by the caller)."""
        self.region.remove(served.where)
        del self.by_slot[served.where.slot]
        self._areas_moved(served.where.slot, 0, 0)

    def _areas_moved(self, slot: int, start: int, lanes: int) -> None:
        self.slot_start[slot], self.slot_lanes[slot] = start, lanes
        placed = np.flatnonzero(self.slot_lanes)
        self.placed = placed[np.argsort(self.slot_start[placed], kind="stable")]
        if len(self.found) < self.region.high:
            self.found = np.zeros(self.region.high, np.int64)

    def pending(self, slots: np.ndarray | None = None) -> np.ndarray:
        """[k] lanes with a request not answered (only an area's own lanes count): of every
        area (in lane order), or (``slots``) only of the areas in those header slots (slot
        by slot, each area's in lane order; numpy's pass over every lane: lane order)."""
        if self.scan is not None:
            which = self.placed if slots is None else np.sort(slots)
            n = self.scan(self.region.lanes, *self.seq_at, self.slot_start, self.slot_lanes, which, self.found)
            return self.found[:n].copy()
        return self._pending_numpy(slots)

    def _pending_numpy(self, slots: np.ndarray | None) -> np.ndarray:
        """``pending`` without native/scan.c (the extension not built, or ``scan`` left out
        of ``inference.native_parts``): area by area, or (when they are many against the
        region's lanes -- a Python step per area costs about what a vectorised look at
        ~FULL_SCAN_LANES lanes does) one pass over every lane. The test oracle of scan.c
        (tests/unit/test_inference_server.py: the native lane scan agrees with numpy)."""
        if slots is None or len(slots) * FULL_SCAN_LANES > self.region.high + FULL_SCAN_LANES:
            lanes = self.region.lanes  # (one vectorised pass beats a Python loop over many areas)
            return np.flatnonzero((lanes["req_seq"] != lanes["resp_seq"]) & self.region.served)
        parts = []
        for slot in sorted(slots.tolist()):
            served = self.by_slot.get(slot)
            if served is not None:
                start = served.where.start
                lanes = self.region.lanes[start:start + served.where.served]
                parts.append(np.flatnonzero(lanes["req_seq"] != lanes["resp_seq"]) + start)
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def arrivals(self, held: bool, pend: np.ndarray | None = None) -> int:
        """Pending lanes not looked at yet (and, unless held, those left pending); ``pend``:
        this turn's ``pending()`` lanes, when the caller has them already."""
        pend = self.pending() if pend is None else pend
        return len(pend) if not held else int(np.count_nonzero(~self.deferred[pend]))

    def keep_pending(self, pending: np.ndarray, admitted: np.ndarray) -> None:
        """After the admit stage: exactly the ``pending`` lanes not ``admitted`` are left
        pending (``deferred``: the next turn scans every area for them)."""
        if len(admitted) < len(pending):
            self.deferred[:] = False
            self.deferred[pending] = True
            self.deferred[admitted] = False
            self.any_deferred = True
        elif self.any_deferred:
            self.deferred[:] = False
            self.any_deferred = False

    def defer(self, lanes: np.ndarray) -> None:
        """Leave these admitted lanes pending too (no weights yet, or a sample cut)."""
        if len(lanes):
            self.deferred[lanes] = True
            self.any_deferred = True

    def wake(self, idx: np.ndarray) -> None:
        """After answering lanes ``idx``: ring each of their areas whose client sleeps."""
        owner, words = self.region.owner, self.region.headers[:, WAITING_OFFSET // 4]
        if len(idx) == 1:
            slot = int(owner[idx[0]])
            store_load_fence()
            if words[slot]:
                words[slot] = 0
                self.by_slot[slot].bell.ring()
            return
        owners = owner[idx]
        slots = owners[:1] if (owners == owners[0]).all() else np.unique(owners)  # (one area: no sort)
        store_load_fence()
        for slot in slots[words[slots] != 0]:
            words[slot] = 0
            self.by_slot[int(slot)].bell.ring()

    def close(self) -> None:
        self.by_slot.clear()
        self.region.close()
