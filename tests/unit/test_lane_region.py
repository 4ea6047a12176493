"""LaneRegion: areas mapped back to back read as one array, headers as one matrix, removal
leaves idle zero lanes, ranges are reused, group ids stay per area."""
from __future__ import annotations

import os

import numpy as np
import pytest

from rlinkd.shm.errors import ShmError
from rlinkd.shm.lane_region import LaneRegion
from rlinkd.shm.lanes import WAITING_OFFSET, LaneArea, LaneLayout, complete_groups
from rlinkd.shm.records import StepLayout


def layout(obs=4):
    return LaneLayout(StepLayout.flat(obs, 1, 2))


def area(tmp_path, name, lanes=1, lay=None):
    path = str(tmp_path / name)
    a = LaneArea.create(path, lay or layout(), lanes)
    fd = os.open(path, os.O_RDWR)
    return a, fd


def test_areas_are_one_array_and_writes_reach_both_sides(tmp_path):
    region = LaneRegion(layout(), max_bytes=1 << 24, max_slots=8)
    (a, fa), (b, fb) = area(tmp_path, "a"), area(tmp_path, "b", lanes=100)
    pa, pb = region.place(fa, a), region.place(fb, b)
    span = a.layout.span_lanes  # (64-byte lanes: 64 to a page)
    assert (pa.start, pb.start, pb.served) == (0, span(1), 100) and region.high == span(1) + span(100)
    assert list(region.served[:span(1)]) == [True] + [False] * (span(1) - 1)  # a's page: 1 lane its own
    b.lanes["obs"]["obs"][3] = [1, 2, 3, 4]
    b.publish(3)
    a.publish(0)
    pend = np.flatnonzero(region.lanes["req_seq"] != region.lanes["resp_seq"])
    assert list(pend) == [0, pb.start + 3] and list(region.owner[pend]) == [pa.slot, pb.slot]
    assert list(region.lanes["obs"]["obs"][pb.start + 3]) == [1, 2, 3, 4]
    region.lanes["resp_seq"][pend] = region.lanes["req_seq"][pend]  # the server answers
    assert a.answered(0) and b.answered(3)
    b.announce_client_wait()
    assert list(region.headers[:, WAITING_OFFSET // 4]) == [0, 1]
    for fd in (fa, fb):
        os.close(fd)
    region.close()


def test_a_removed_area_leaves_idle_lanes_and_its_range_is_reused(tmp_path):
    region = LaneRegion(layout(), max_bytes=1 << 24, max_slots=2)
    (a, fa), (b, fb), (c, fc) = (area(tmp_path, n) for n in "abc")
    pa, pb = region.place(fa, a), region.place(fb, b)
    a.publish(0)
    region.remove(pa)
    assert a.lanes["req_seq"][0] == 1 and region.lanes["req_seq"][0] == 0  # unmapped: zeros
    assert region.owner[0] == -1 and not (region.lanes["req_seq"] != region.lanes["resp_seq"]).any()
    pc = region.place(fc, c)
    assert (pc.start, pc.slot) == (pa.start, pa.slot) and region.high == pb.start + pb.count
    c.publish(0)
    assert region.lanes["req_seq"][0] == 1
    before = (region.high, list(region.free), list(region.free_slots), region.slots)
    with pytest.raises(ShmError, match="areas"):
        region.place(fa, a)  # two slots, both taken
    assert (region.high, list(region.free), list(region.free_slots), region.slots) == before
    region.close()


def test_a_refused_mapping_leaves_the_region_as_it_was(tmp_path):
    region = LaneRegion(layout(), max_bytes=1 << 24, max_slots=4)
    (a, fa), (b, fb) = area(tmp_path, "a"), area(tmp_path, "b")
    region.place(fa, a)
    bad = os.open(str(tmp_path / "b"), os.O_RDONLY)  # (a shared read-write mapping of it fails)
    with pytest.raises(ShmError, match="mmap"):
        region.place(bad, b)
    assert region.free_slots == [1] and region.free == [(64, 64)] and not region.served[64:].any()
    assert region.slots == 2 and region.headers[1, 0] == 0  # (slot 1 readable: a zero page, no fault)
    assert region.place(fb, b).slot == 1
    region.close()


def test_freed_neighbours_merge_and_a_bigger_area_reuses_them(tmp_path):
    region = LaneRegion(layout(), max_bytes=1 << 24, max_slots=8)
    placed = [region.place(fd, ar) for ar, fd in (area(tmp_path, n) for n in "abc")]
    region.remove(placed[0])
    region.remove(placed[1])
    assert region.free == [(0, 128)]
    big, fb = area(tmp_path, "big", lanes=100)  # two pages of lanes: fits the merged range
    assert region.place(fb, big).start == 0 and region.high == 192
    region.close()


def test_lanes_past_an_areas_own_are_never_pending(tmp_path):
    """The rest of an area's last page is its client's memory: a request written there is
    never served (``served`` is False), however the client scribbles."""
    region = LaneRegion(layout(), max_bytes=1 << 24, max_slots=8)
    a, fa = area(tmp_path, "a", lanes=2)
    where = region.place(fa, a)
    raw = np.ndarray((64,), a.layout.dtype, buffer=a.segment.buf, offset=a.start)  # the whole page
    raw["req_seq"][5] = 7
    assert region.lanes["req_seq"][where.start + 5] == 7  # mapped, visible ...
    pend = (region.lanes["req_seq"] != region.lanes["resp_seq"]) & region.served
    assert not pend.any()  # ... and not pending
    region.close()


def test_a_region_refuses_another_layout_and_a_full_span(tmp_path):
    region = LaneRegion(layout(), max_bytes=8192, max_slots=8)
    other, fo = area(tmp_path, "o", lay=layout(obs=9))
    with pytest.raises(ShmError, match="layout"):
        region.place(fo, other)
    big, fb = area(tmp_path, "b", lanes=200)
    with pytest.raises(ShmError, match="full"):
        region.place(fb, big)
    region.close()


def test_group_ids_are_per_area(tmp_path):
    region = LaneRegion(layout(), max_bytes=1 << 24, max_slots=8)
    (a, fa), (b, fb) = area(tmp_path, "a", 2), area(tmp_path, "b", 2)
    pa, pb = region.place(fa, a), region.place(fb, b)
    for ar in (a, b):  # both use group id 5 of size 2; only a's is complete
        ar.lanes["group"][:2], ar.lanes["group_size"][:2] = 5, 2
    a.publish(0)
    a.publish(1)
    b.publish(0)
    pend = np.flatnonzero(region.lanes["req_seq"] != region.lanes["resp_seq"])
    ready = complete_groups(region.lanes, pend, region.owner)
    assert list(ready) == [pa.start, pa.start + 1] and pb.start not in ready
    region.close()
