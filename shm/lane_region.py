"""LaneRegion: many lane areas mapped back to back, read as one array (inference role side).

Every shared-memory action client has its own lane area (a sealed memfd: a client can reach
only its own lanes). The inference role would then pay Python work per area on every turn.
Instead it maps each area's lanes, which start on a page and fill whole pages
(``shm.lanes``), at a chosen place in one reserved span of address space, next to the others
(``mmap`` with ``MAP_FIXED`` over a ``PROT_NONE`` reservation), and each area's header page in
a second span, one page per area slot::

    lanes span    [area a: lanes 0..ca) [area b: lanes ca..ca+cb) [freed: zero pages] ...  high
    headers span  [page of slot 0] [page of slot 1] ...                                 slots

``lanes`` is then one structured array over lanes ``[0, high)`` of every area (a global lane
index per request), ``headers`` one u32 matrix [slots, PAGE / 4] of their header words, and
``owner`` [high] the slot each lane belongs to (-1: free, or past an area's own lanes in its
last page: ``served`` is False there and such a lane is never answered). An area takes
``LaneLayout.span_lanes`` lanes of address space (whole pages that hold whole lanes); its file
is mapped over the first pages, zero pages fill the rest. A removed area's pages are
replaced by private zero pages (lanes that never have a request; headers nobody reads) and
its range (merged with free neighbours) is reused by a later area that fits. The numpy views
stay valid for the region's life.

Used only by the inference role (one region per policy; all areas of a policy share its lane
layout). Not thread-safe. ``ShmError`` when the span or the slots are exhausted.
"""
from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass

import numpy as np

from rlinkd.shm.errors import ShmError
from rlinkd.shm.lanes import LANE_ALIGN, LaneArea, LaneLayout
from rlinkd.shm.records import align

PROT_NONE, PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE
MAP_FIXED, MAP_NORESERVE = 0x10, 0x4000
MAP_FAILED = ctypes.c_void_p(-1).value
MAX_REGION_BYTES = 1 << 32  # address space reserved for one policy's lanes (no memory behind it)
MAX_SLOTS = 1 << 14          # areas of one policy at once

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def _mmap(addr: int | None, size: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
    got = _libc.mmap(addr, size, prot, flags, fd, offset)
    if got in (None, MAP_FAILED) or (addr is not None and got != addr):
        err = ctypes.get_errno()
        raise ShmError(f"mmap of {size} bytes failed: {os.strerror(err)}")
    return got


@dataclass(frozen=True)
class Placement:
    """Where one area sits: lanes ``[start, start + count)`` of address space, of which the
    first ``served`` are the area's own (the rest never carry a request), header slot ``slot``."""

    start: int
    count: int
    slot: int
    served: int = 0

    @property
    def lanes(self) -> slice:
        return slice(self.start, self.start + self.count)


NOWHERE = Placement(0, 0, -1)  # an area not placed yet
PRIVATE_FIXED = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED


class LaneRegion:
    """The lanes of every area of one policy, as one array (see the module docstring)."""

    def __init__(self, layout: LaneLayout, max_bytes: int = MAX_REGION_BYTES,
                 max_slots: int = MAX_SLOTS) -> None:
        self.layout, self.lane_bytes = layout, layout.lane_bytes
        self.max_lanes = max_bytes // self.lane_bytes
        self._lane_span = self.max_lanes * self.lane_bytes // LANE_ALIGN * LANE_ALIGN
        self._head_span = max_slots * LANE_ALIGN
        private = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE
        self._lane_base = _mmap(None, self._lane_span, PROT_NONE, private)
        self._head_base = _mmap(None, self._head_span, PROT_NONE, private)
        self._all = np.ndarray((self._lane_span // self.lane_bytes,), layout.dtype,
                               buffer=memoryview((ctypes.c_char * self._lane_span).from_address(self._lane_base)))
        self._heads = np.ndarray((max_slots, LANE_ALIGN // 4), np.uint32,
                                 buffer=memoryview((ctypes.c_char * self._head_span).from_address(self._head_base)))
        self.high = 0   # lanes [0, high) are mapped (areas or zero pages)
        self.slots = 0  # header slots [0, slots) are mapped
        self.free: list[tuple[int, int]] = []  # (start, count) of zero-page lane ranges, sorted
        self.free_slots: list[int] = []
        self.owner = np.empty(0, np.int64)   # [high] header slot of each lane's area, -1: none
        self.served = np.empty(0, bool)      # [high] owner >= 0
        self.lanes = self._all[:0]
        self.headers = self._heads[:0]

    # ------------------------------------------------------------ areas in and out
    def place(self, fd: int, area: LaneArea) -> Placement:
        """Map the area behind ``fd`` (its lanes and its header page); the caller keeps
        ``fd`` (a mapping does not need it open). ``area`` is its checked ``LaneArea``.
        ``ShmError`` (region full, mmap refused) leaves the region as it was."""
        if area.layout.lane_bytes != self.lane_bytes or area.layout.dtype != self.layout.dtype:
            raise ShmError(f"{area.segment.path}: its lane layout is not this region's")
        count = self.layout.span_lanes(area.capacity)
        slot = self._take_slot()
        try:
            start = self._take_range(count)
        except ShmError:
            self.free_slots.append(slot)
            raise
        try:
            _mmap(self._lane_addr(start), align(area.capacity * self.lane_bytes, LANE_ALIGN), PROT_RW,
                  mmap.MAP_SHARED | MAP_FIXED, fd, area.start)
            _mmap(self._head_addr(slot), LANE_ALIGN, PROT_RW, mmap.MAP_SHARED | MAP_FIXED, fd, 0)
        except ShmError:
            self.remove(Placement(start, count, slot))
            raise
        self.owner[start:start + area.capacity] = slot
        self.served[start:start + area.capacity] = True
        return Placement(start, count, slot, area.capacity)

    def remove(self, where: Placement) -> None:
        """Zero pages in place of the area's lanes and header; both are free for reuse."""
        _mmap(self._lane_addr(where.start), where.count * self.lane_bytes, PROT_RW, PRIVATE_FIXED)
        _mmap(self._head_addr(where.slot), LANE_ALIGN, PROT_RW, PRIVATE_FIXED)
        self.owner[where.lanes] = -1
        self.served[where.lanes] = False
        self._give_range(where.start, where.count)
        self.free_slots.append(where.slot)

    def close(self) -> None:
        """Unmap everything (every view of ``lanes``/``headers`` must be dropped first)."""
        self.lanes = self._all = self.headers = self._heads = None  # type: ignore[assignment]
        _libc.munmap(self._lane_base, self._lane_span)
        _libc.munmap(self._head_base, self._head_span)

    # ------------------------------------------------------------ allocation
    def _lane_addr(self, lane: int) -> int:
        return self._lane_base + lane * self.lane_bytes

    def _head_addr(self, slot: int) -> int:
        return self._head_base + slot * LANE_ALIGN

    def _take_range(self, count: int) -> int:
        """First fit among freed ranges, else above ``high`` (mapped as zero pages first)."""
        for i, (start, have) in enumerate(self.free):
            if have >= count:
                self.free[i:i + 1] = [(start + count, have - count)] if have > count else []
                return start
        start = self.high
        if start + count > len(self._all):
            raise ShmError(f"lane region full: {self.max_lanes} lanes of {self.lane_bytes} bytes")
        _mmap(self._lane_addr(start), count * self.lane_bytes, PROT_RW, PRIVATE_FIXED)
        self.high = start + count
        self.lanes = self._all[:self.high]
        self.owner = np.concatenate([self.owner, np.full(count, -1, np.int64)])
        self.served = np.concatenate([self.served, np.zeros(count, bool)])
        return start

    def _give_range(self, start: int, count: int) -> None:
        """A range is free again: merged with free neighbours (mixed sizes do not fragment
        the region for good)."""
        self.free.append((start, count))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for s, c in self.free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + c)
            else:
                merged.append((s, c))
        self.free = merged

    def _take_slot(self) -> int:
        """A header slot; a new one is mapped as a zero page first (every slot below
        ``slots`` is always readable)."""
        if self.free_slots:
            return self.free_slots.pop()
        if self.slots == len(self._heads):
            raise ShmError(f"lane region full: {len(self._heads)} areas")
        _mmap(self._head_addr(self.slots), LANE_ALIGN, PROT_RW, PRIVATE_FIXED)
        self.slots += 1
        self.headers = self._heads[:self.slots]
        return self.slots - 1
