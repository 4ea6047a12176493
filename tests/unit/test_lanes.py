"""shm.lanes: layout, attach checks, publish/answer handshake, sleep/wait flags."""
from __future__ import annotations

import os

import numpy as np
import pytest

from rlinkd.shm.errors import LayoutError
from rlinkd.shm.lanes import (LANE_ALIGN, LANE_HEADER, MAX_LANES, OP_STEP, LaneArea, LaneLayout, lanes_offset)
from rlinkd.shm.records import StepLayout


def layout(obs=4, actions=1) -> LaneLayout:
    return LaneLayout(StepLayout.flat(obs, actions, 2))


def test_lane_layout_is_cache_line_sized_and_round_trips():
    lay = layout()
    assert lay.lane_bytes % 64 == 0 and lay.dtype.itemsize == lay.lane_bytes
    assert lay.dtype.fields["obs"][1] == lay.obs_offset and lay.obs_offset % 8 == 0
    assert LaneLayout.from_json(lay.to_json()) == lay
    mixed = LaneLayout(StepLayout((("img", "|u1", (3, 2)), ("pos", "<i8", (2,))), 3, 0))
    assert mixed.dtype["obs"]["pos"].itemsize == 16 and mixed.dtype.fields["action"][1] == 40


def test_from_json_refuses_a_wrong_size():
    spec = layout().to_json() | {"lane_bytes": 64 * 99}
    with pytest.raises(LayoutError, match="bytes a record"):
        LaneLayout.from_json(spec)


def test_create_attach_and_publish_answer(tmp_path):
    lay = layout()
    area = LaneArea.create(str(tmp_path / "a"), lay, 8)
    peer = LaneArea.attach(str(tmp_path / "a"), lay)
    assert peer.capacity == 8 and len(peer.pending()) == 0
    area.lanes["obs"]["obs"][3] = [1, 2, 3, 4]
    area.lanes["op"][3] = OP_STEP
    area.publish(3)
    assert area.requests == 1 and not area.answered(3)
    assert list(peer.pending()) == [3] and peer.lanes["op"][3] == OP_STEP
    assert np.array_equal(peer.lanes["obs"]["obs"][3], [1, 2, 3, 4])
    pending = peer.pending()
    peer.lanes["action"][pending] = 1.0
    peer.answer(pending, peer.lanes["req_seq"][pending])
    assert area.answered(3) and float(area.lanes["action"][3][0]) == 1.0
    assert len(peer.pending()) == 0
    peer.close()
    area.close()


def test_seq_words_wrap_around(tmp_path):
    area = LaneArea.create(str(tmp_path / "a"), layout(), 1)
    area.lanes["req_seq"][0] = area.lanes["resp_seq"][0] = 0xFFFFFFFF
    area.publish(0)
    assert area.lanes["req_seq"][0] == 0 and not area.answered(0)
    area.answer(np.array([0]), area.lanes["req_seq"][[0]])
    assert area.answered(0)


def test_sleep_and_wait_flags_are_taken_once(tmp_path):
    area = LaneArea.create(str(tmp_path / "a"), layout(), 1)
    assert not area.take_server_sleeping()
    area.announce_server_sleep()
    assert area.server_sleeping and area.take_server_sleeping() and not area.take_server_sleeping()
    area.announce_client_wait()
    assert area.take_client_waiting() and not area.take_client_waiting()


def test_sealed_area_passes_through_an_fd(tmp_path):
    lay = layout()
    area = LaneArea.create_sealed("test-lanes", lay, 4)
    peer = LaneArea.from_fd(os.dup(area.segment.fd), "test-lanes", lay)
    area.publish(2)
    assert list(peer.pending()) == [2]


@pytest.mark.parametrize("damage, error", [
    (lambda buf: buf.__setitem__(slice(0, 8), b"RLKRINGX"), "magic"),
    (lambda buf: LANE_HEADER.pack_into(buf, 0, b"RLKLANE1", 99, 0, 0, 0, 0, 0, 0, 0, 0, 0), "layout_version"),
    (lambda buf: buf.__setitem__(slice(48, 52), (64 + 4096).to_bytes(4, "little")), "lanes_offset"),
])
def test_attach_checks_the_header(tmp_path, damage, error):
    path = str(tmp_path / "a")
    area = LaneArea.create(path, layout(), 2)
    damage(area.segment.buf)
    with pytest.raises(LayoutError, match=error):
        LaneArea.attach(path)


def test_attach_refuses_another_layout_and_too_many_lanes(tmp_path):
    path = str(tmp_path / "a")
    area = LaneArea.create(path, layout(), 2)
    with pytest.raises(LayoutError, match="not the expected"):
        LaneArea.attach(path, layout(obs=5))
    words = area.segment.buf[:64].cast("I")
    words[4] = 65  # capacity beyond the file's size (its lanes fill one page: 64)
    with pytest.raises(LayoutError, match="do not fit"):
        LaneArea.attach(path)
    with pytest.raises(ValueError):
        LaneArea.create(str(tmp_path / "b"), layout(), MAX_LANES + 1)
    assert lanes_offset(1) == LANE_ALIGN and area.segment.size % LANE_ALIGN == 0  # (whole pages)


def test_a_group_is_ready_only_when_all_its_members_are(tmp_path):
    area = LaneArea.create(str(tmp_path / "a"), layout(), 8)
    for lane, group in ((0, 0), (1, 7), (2, 7)):
        area.lanes["group"][lane], area.lanes["group_size"][lane] = group, 3 if group else 0
        area.publish(lane)
    idx, incomplete = area.ready()
    assert list(idx) == [0] and incomplete  # group 7 has 2 of its 3 requests in
    area.lanes["group"][5], area.lanes["group_size"][5] = 7, 3
    area.publish(5)
    idx, incomplete = area.ready()
    assert list(idx) == [0, 1, 2, 5] and not incomplete


def test_publish_group_publishes_rows_as_one_group_and_wraps_seqs(tmp_path):
    area = LaneArea.create(str(tmp_path / "a"), layout(), 8)
    area.lanes["req_seq"][3] = area.lanes["resp_seq"][3] = 0xFFFFFFFF  # wraps to 0
    area.publish_group(np.array([1, 3]), 9)
    idx, incomplete = area.ready()  # the lone group of a vector client: its fast path
    assert list(idx) == [1, 3] and not incomplete and area.requests == 2
    assert area.lanes["req_seq"][3] == 0 and list(area.lanes["group_size"][[1, 3]]) == [2, 2]
    assert not area.answered_all(np.array([1, 3]))
    area.answer(idx, area.lanes["req_seq"][idx])
    assert area.answered_all(np.array([1, 3]))
    area.lanes["group"][6], area.lanes["group_size"][6] = 4, 2  # 1 of 2 in: waits, alone
    area.publish(6)
    idx, incomplete = area.ready()
    assert len(idx) == 0 and incomplete
