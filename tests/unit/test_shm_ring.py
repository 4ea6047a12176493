"""StepRing in one process: index arithmetic, wrap-around, full/empty, header checks."""

import os
import struct
import threading
import time

import numpy as np
import pytest

from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.errors import LayoutError, RingFull, ShmError
from rlinkd.shm.records import FLUSH, HAS_DIST, HAS_LOGP, TERMINATED, StepLayout
from rlinkd.shm.ring import RING_HEADER, StepRing, arm_sleep, disarm_sleep, records_offset
from tests.unit.shm_helpers import LAYOUT, assert_numbered, numbered

@pytest.fixture
def ring(shm_dir):
    ring = StepRing.create(os.path.join(shm_dir, "ring"), LAYOUT, 8)
    yield ring
    ring.close()


def test_wrap_around_many_times_with_uneven_sizes(ring):
    written = read = 0
    sizes = [3, 5, 7, 1, 8, 2, 6, 4]
    for round_ in range(40):
        count = ring.write_batch(numbered(written, sizes[round_ % 8]))
        assert count == sizes[round_ % 8] or ring.free_records() == 0
        written += count
        out = ring.read_batch(sizes[(round_ + 3) % 8])
        assert_numbered(out, read)
        read += len(out)
        assert ring.readable_records() == written - read
    assert written > 10 * ring.capacity
    assert_numbered(ring.read_batch(100), read)


def test_full_ring_refuses_more_and_never_overwrites(ring):
    assert ring.write_batch(numbered(0, 5)) == 5
    assert ring.write_batch(numbered(5, 7)) == 3  # partial: only 3 fit
    assert ring.free_records() == 0
    assert ring.write_batch(numbered(8, 1)) == 0
    with pytest.raises(RingFull, match="is full"):
        ring.write_step(0, [1, 2, 3, 4], 0, 0.0)
    assert_numbered(ring.read_batch(8), 0)
    assert len(ring.read_batch(8)) == 0 and ring.readable_records() == 0


def test_write_batch_raises_ring_full_at_the_deadline(ring):
    ring.write_batch(numbered(0, 6))
    started = time.monotonic()
    with pytest.raises(RingFull, match=r"did not fit within 0\.2s"):
        ring.write_batch(numbered(6, 3), timeout_s=0.2)
    assert time.monotonic() - started >= 0.19
    assert ring.readable_records() == 6  # all-or-nothing: nothing written
    with pytest.raises(ValueError, match="can never fit"):
        ring.write_batch(numbered(0, 9), timeout_s=1.0)


def test_write_batch_with_timeout_waits_for_the_consumer(ring):
    ring.write_batch(numbered(0, 8))
    consumer = threading.Thread(target=ring.read_batch, args=(4,))
    timer = threading.Timer(0.05, consumer.start)
    timer.start()
    assert ring.write_batch(numbered(8, 4), timeout_s=10.0) == 4
    timer.join()
    consumer.join()
    assert_numbered(ring.read_batch(8), 4)


def test_write_step_accepts_lists_arrays_scalars_and_sets_has_flags(ring):
    ring.write_step(TERMINATED, np.arange(4, dtype=np.float32), 1, 1.5, weights_seq_no=7)
    ring.write_step(0, [4, 5, 6, 7], np.int64(2), -1.0, logp=-0.25, dist=np.array([0.5, 0.25]))
    ring.write_step(FLUSH, (0, 0, 0, 0), [3.0], 0.0, dist=[1, 2])
    out = ring.read_batch(3)
    np.testing.assert_array_equal(out["flags"], [TERMINATED, HAS_LOGP | HAS_DIST, FLUSH | HAS_DIST])
    np.testing.assert_array_equal(out["weights_seq_no"], [7, -1, -1])
    np.testing.assert_array_equal(out["obs"]["obs"], [[0, 1, 2, 3], [4, 5, 6, 7], [0, 0, 0, 0]])
    np.testing.assert_array_equal(out["action"][:, 0], [1, 2, 3])
    np.testing.assert_array_equal(out["dist"], [[0, 0], [0.5, 0.25], [1, 2]])
    np.testing.assert_array_equal(out["logp"], [0, -0.25, 0])
    np.testing.assert_array_equal(out["stream_id"], [0, 0, 0])


@pytest.mark.parametrize("obs, action, dist, message", [
    ([1, 2, 3], 0, None, "obs has 3 values"),
    (np.zeros((2, 4), np.float32), 0, None, "obs has 8 values"),
    ([1, 2, 3, 4], [0, 1], None, "action has 2 values"),
    ([1, 2, 3, 4], 0, [1.0], "dist has 1 values"),
])
def test_write_step_rejects_wrong_sizes_without_writing(ring, obs, action, dist, message):
    with pytest.raises(ValueError, match=message):
        ring.write_step(0, obs, action, 0.0, dist=dist)
    assert ring.readable_records() == 0


def test_write_batch_rejects_foreign_dtypes(ring):
    with pytest.raises(TypeError, match="1-D array"):
        ring.write_batch(StepLayout.flat(5, 1, 2).empty(2))


def test_wait_readable_deadline_and_closed(shm_dir):
    with Doorbell.create() as bell:
        ring = StepRing.create(os.path.join(shm_dir, "r"), LAYOUT, 8, doorbell=bell)
        started = time.monotonic()
        assert ring.wait_readable(0.05) is False
        assert time.monotonic() - started >= 0.045
        ring.mark_closed()
        assert ring.is_closed() and ring.wait_readable(0.0) is True
        ring.close()


def test_wait_readable_polls_without_a_doorbell(ring):
    assert ring.wait_readable(0.01) is False
    threading.Timer(0.02, ring.write_step, args=(0, [1, 2, 3, 4], 0, 0.0)).start()
    assert ring.wait_readable(10.0) is True
    assert ring.readable_records() == 1


def test_arm_sleep_over_many_rings_sharing_one_doorbell(shm_dir):
    with Doorbell.create() as bell:
        rings = [StepRing.create(os.path.join(shm_dir, f"r{i}"), LAYOUT, 8, doorbell=bell) for i in range(3)]
        assert arm_sleep(rings) is False
        assert all(r.header()["reader_sleeping"] == 1 for r in rings)
        rings[1].write_step(0, [1, 2, 3, 4], 0, 0.0)
        assert bell.wait(1.0) is True  # the producer saw the flag and rang
        assert rings[1].header()["reader_sleeping"] == 0  # ...and cleared its ring's flag
        disarm_sleep(rings)
        assert [r.header()["reader_sleeping"] for r in rings] == [0, 0, 0]
        assert arm_sleep(rings) is True  # data already readable: do not sleep
        for r in rings:
            r.close()


def test_close_is_idempotent_and_a_closed_ring_refuses_writes(ring):
    ring.write_batch(numbered(0, 2))
    ring.close()
    ring.close()
    with pytest.raises(ShmError, match="closed"):
        ring.write_step(0, [1, 2, 3, 4], 0, 0.0)


def test_attach_finds_the_same_ring_and_records_roles(shm_dir, ring):
    producer = StepRing.attach(ring.path, LAYOUT, role="producer")
    assert producer.layout == LAYOUT and producer.capacity == 8
    producer.write_batch(numbered(0, 3))
    assert_numbered(ring.read_batch(3), 0)
    assert producer.header()["writer_pid"] == os.getpid()
    producer.close()


def _rewrite_header(path, **fields):
    with open(path, "r+b") as file:
        values = dict(zip(("magic", "layout_version", "record_bytes", "capacity", "writer_pid"),
                          RING_HEADER.unpack(file.read(RING_HEADER.size))[:5]))
        values.update(fields)
        file.seek(0)
        file.write(struct.pack("<8sIIQI", *values.values()))


RECORDS_AT = records_offset(LAYOUT)


@pytest.mark.parametrize("fields, message", [
    ({"magic": b"XXXXXXXX"}, r"bad magic b'XXXXXXXX' in .*/ring: not an rlinkd step ring"),
    ({"layout_version": 2}, r"layout_version mismatch in .*/ring: header has 2, expected 3"),
    ({"record_bytes": 72}, r"record_bytes mismatch in .*/ring: header has 72, expected 64"),
    ({"capacity": 6}, r"capacity 6 in .*/ring is not a power of two"),
    ({"capacity": 16}, rf"file size .* mismatch in .*/ring: header has {RECORDS_AT + 512}, "
                       rf"expected {RECORDS_AT + 1024}"),
    ({"writer_pid": 0}, r"writer_pid 0 in .*/ring: header was never completed"),
])
def test_attach_refuses_bad_headers_with_a_clear_message(ring, fields, message):
    _rewrite_header(ring.path, **fields)
    with pytest.raises(LayoutError, match=message):
        StepRing.attach(ring.path)


def test_attach_refuses_an_unexpected_layout(ring):
    with pytest.raises(LayoutError, match=r"step layout mismatch .* obs field 0: header has \('obs', '<f4', \(4,\)\), "
                                          r"expected \('obs', '<f4', \(8,\)\)"):
        StepRing.attach(ring.path, expected_layout=StepLayout.flat(8, 1, 2))


def test_a_sealed_ring_is_produced_through_a_passed_descriptor():
    """The collector's side (create_sealed) and a client's (attach_fd on a descriptor)."""
    ring = StepRing.create_sealed("rlk.client-1-x", LAYOUT, 8)
    producer = StepRing.attach_fd(os.dup(ring.segment.fd), "rlk.client-1-x", LAYOUT)
    try:
        assert producer.path == ring.path == "memfd:rlk.client-1-x" and producer.capacity == 8
        producer.write_batch(numbered(0, 5))
        assert_numbered(ring.read_batch(8), 0)
        assert ring.header()["writer_pid"] == os.getpid()
        with pytest.raises(PermissionError):
            os.ftruncate(ring.segment.fd, 0)
    finally:
        producer.close()
        ring.close()


def test_attach_fd_checks_the_header_and_always_takes_the_descriptor():
    ring = StepRing.create_sealed("rlk.r", LAYOUT, 8)
    fd = os.dup(ring.segment.fd)
    with pytest.raises(LayoutError, match=r"step layout mismatch.*obs field 0: header has .*expected .*\(8,\)"):
        StepRing.attach_fd(fd, "rlk.r", expected_layout=StepLayout.flat(8, 1, 2))
    with pytest.raises(OSError):
        os.fstat(fd)  # closed by the failed attach
    ring.close()


def test_create_requires_a_power_of_two(shm_dir):
    with pytest.raises(ValueError, match="power of two"):
        StepRing.create(os.path.join(shm_dir, "bad"), LAYOUT, 12)
    assert os.listdir(shm_dir) == []


# ---------------------------------------------------------------- producer waits for space (space doorbell)

SLEEP_LONGER_THAN_TEST_S = 600.0  # only a doorbell ring can end such a sleep within the test's deadlines


def free_space_once_producer_waits(ring, consumer_view, count):
    """Consumer thread: wait (with a deadline) until the producer announced its wait, then read."""
    deadline = time.monotonic() + 30.0
    while not consumer_view.header()["writer_waiting"]:
        assert time.monotonic() < deadline, "producer never announced its wait"
        time.sleep(0.001)
    consumer_view.read_batch(count)


def test_full_ring_producer_sleeps_once_and_wakes_when_the_consumer_frees_space(shm_dir):
    with Doorbell.create() as space:
        producer = StepRing.create(os.path.join(shm_dir, "r"), LAYOUT, 8, space_doorbell=space)
        consumer = StepRing.attach(producer.path, role="consumer", space_doorbell=space)
        producer.max_sleep_slice_s = SLEEP_LONGER_THAN_TEST_S
        producer.write_batch(numbered(0, 8))
        thread = threading.Thread(target=free_space_once_producer_waits, args=(producer, consumer, 4))
        thread.start()
        assert producer.write_batch(numbered(8, 4), timeout_s=30.0) == 4  # only a ring ends the sleep in time
        thread.join()
        assert producer.producer_sleeps == 1  # one announced wait, no polling loop
        assert producer.header()["writer_waiting"] == 0
        assert_numbered(consumer.read_batch(8), 4)
        consumer.close()
        producer.close()


def test_consumer_rings_the_space_doorbell_only_when_the_producer_waits(shm_dir):
    with Doorbell.create() as space:
        producer = StepRing.create(os.path.join(shm_dir, "r"), LAYOUT, 8, space_doorbell=space)
        consumer = StepRing.attach(producer.path, role="consumer", space_doorbell=space)
        producer.write_batch(numbered(0, 8))
        consumer.read_batch(2)
        assert space.drain() == 0  # nobody waited: no syscall
        assert producer.arm_space_wait(8) is False and producer.producer_sleeps == 1
        consumer.read_batch(1)
        assert space.drain() == 1 and producer.header()["writer_waiting"] == 0
        assert producer.arm_space_wait(1) is True  # space already there: do not sleep
        producer.disarm_space_wait()
        assert producer.producer_sleeps == 1
        consumer.close()
        producer.close()


def test_wait_writable_with_space_doorbell_honours_the_deadline(shm_dir):
    with Doorbell.create() as space:
        ring = StepRing.create(os.path.join(shm_dir, "r"), LAYOUT, 8, space_doorbell=space)
        ring.write_batch(numbered(0, 8))
        started = time.monotonic()
        assert ring.wait_writable(1, 0.05) is False
        assert time.monotonic() - started >= 0.045
        with pytest.raises(RingFull):
            ring.write_batch(numbered(8, 1), timeout_s=0.01)
        ring.close()
