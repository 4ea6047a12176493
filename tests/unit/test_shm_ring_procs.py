"""StepRing across processes: random producer/consumer interleavings and doorbell wake-ups."""

import itertools
import multiprocessing as mp
import os
import time
from multiprocessing import reduction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.errors import RingFull
from rlinkd.shm.ring import StepRing
from tests.unit.shm_helpers import LAYOUT, assert_numbered, numbered

SPAWN = mp.get_context("spawn")
EXAMPLE_DEADLINE_S = 30.0


# ---------------------------------------------------------------- consumer worker process

def consume_example(ring, total, sizes):
    """Read ``total`` numbered records with the given batch sizes; then expect close and nothing more."""
    deadline = time.monotonic() + EXAMPLE_DEADLINE_S
    next_number = 0
    for turn in itertools.count():
        if next_number == total:
            break
        if not ring.wait_readable(deadline - time.monotonic()):
            raise AssertionError(f"consumer stalled at record {next_number} of {total}")
        if ring.is_closed() and not ring.readable_records():
            raise AssertionError(f"ring closed after {next_number} of {total} records")
        chunk = ring.read_batch(sizes[turn % len(sizes)])
        assert_numbered(chunk, next_number)
        next_number += len(chunk)
    while not ring.is_closed():
        if not ring.wait_readable(deadline - time.monotonic()):
            raise AssertionError("producer never closed the ring")
    if ring.readable_records():
        raise AssertionError(f"{ring.readable_records()} records beyond the {total} sent (duplicates?)")
    return next_number


def consumer_worker(conn):
    """Child process: sends its doorbell fd (SCM_RIGHTS), then consumes one example per message."""
    bell = Doorbell.create()
    reduction.send_handle(conn, bell.fileno(), os.getppid())
    while (message := conn.recv()) is not None:
        path, total, sizes = message
        ring = StepRing.attach(path, LAYOUT, doorbell=bell, role="consumer")
        try:
            conn.send((path, "ok", consume_example(ring, total, sizes)))
        except AssertionError as failure:
            conn.send((path, "failed", str(failure)))
        finally:
            ring.close()


@pytest.fixture(scope="module")
def consumer():
    """(connection, doorbell) of one long-lived consumer process shared by all examples."""
    parent_end, child_end = SPAWN.Pipe()
    process = SPAWN.Process(target=consumer_worker, args=(child_end,), daemon=True)
    process.start()
    if not parent_end.poll(60):
        raise AssertionError("consumer worker did not start within 60 s")
    bell = Doorbell.from_fd(reduction.recv_handle(parent_end))
    yield parent_end, bell
    parent_end.send(None)
    process.join(10)
    bell.close()
    assert process.exitcode == 0


# ---------------------------------------------------------------- producer side (this process)

def produce(ring, total, sizes):
    """Write ``total`` numbered records; size 1 uses write_step, larger ones write_batch."""
    next_number, turn = 0, 0
    while next_number < total:
        size = min(sizes[turn % len(sizes)], total - next_number)
        turn += 1
        if size == 1:
            next_number += write_one_step(ring, next_number)
        elif size <= ring.capacity:
            next_number += ring.write_batch(numbered(next_number, size), timeout_s=EXAMPLE_DEADLINE_S)
        else:  # larger than the ring: partial writes, waiting for room in between
            batch = numbered(next_number, size)
            while len(batch):
                assert ring.wait_writable(1, EXAMPLE_DEADLINE_S), "producer stalled"
                written = ring.write_batch(batch)
                next_number, batch = next_number + written, batch[written:]
    ring.mark_closed()


def write_one_step(ring, number):
    while True:
        try:
            ring.write_step(0, [number, 0.25, 0.5, 0.75], number % 3, number * 0.5, weights_seq_no=number)
            return 1
        except RingFull:
            assert ring.wait_writable(1, EXAMPLE_DEADLINE_S), "producer stalled"


def report_for(connection, path):
    """The consumer's verdict on ``path``, skipping late reports of earlier failed examples."""
    deadline = time.monotonic() + EXAMPLE_DEADLINE_S
    while connection.poll(max(0.0, deadline - time.monotonic())):
        reported_path, *verdict = connection.recv()
        if reported_path == path:
            return tuple(verdict)
    raise AssertionError(f"consumer did not report on {path}")


batch_sizes = st.lists(st.integers(1, 40) | st.integers(1, 300), min_size=1, max_size=6)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(capacity=st.sampled_from([8, 16, 64, 256]), total=st.integers(1, 2500),
       producer_sizes=batch_sizes, consumer_sizes=batch_sizes)
def test_random_interleavings_lose_duplicate_and_reorder_nothing(
        shm_dir, consumer, capacity, total, producer_sizes, consumer_sizes):
    connection, bell = consumer
    path = os.path.join(shm_dir, f"ring-{time.monotonic_ns()}")
    ring = StepRing.create(path, LAYOUT, capacity, doorbell=bell)
    try:
        connection.send((path, total, consumer_sizes))
        produce(ring, total, producer_sizes)
        assert report_for(connection, path) == ("ok", total)
    finally:
        ring.mark_closed()  # lets the consumer give up at once if we failed
        ring.close()
        ring.unlink()


# ---------------------------------------------------------------- doorbell wake-up across processes

WAKEUPS = 3000
WAKE_DEADLINE_S = 20.0


def stamping_producer(path, conn):
    """Child: write one record stamped with perf_counter_ns, wait until it is consumed, repeat.

    A random busy-wait jitter before each write lands it anywhere in the
    consumer's arm/re-check/sleep sequence.  Exits with an error if a record
    stays unread: the consumer slept through it (a lost wake-up).
    """
    bell = Doorbell.from_fd(reduction.recv_handle(conn))
    ring = StepRing.attach(path, LAYOUT, doorbell=bell, role="producer")
    jitter = np.random.default_rng(0).uniform(0, 30e-6, WAKEUPS)
    for i in range(WAKEUPS):
        jitter_end = time.perf_counter() + jitter[i]
        while time.perf_counter() < jitter_end:
            pass
        ring.write_step(0, [0, 0, 0, 0], 0, 0.0, weights_seq_no=time.perf_counter_ns())
        deadline = time.monotonic() + WAKE_DEADLINE_S
        while ring.readable_records():
            if time.monotonic() > deadline:
                raise SystemExit(f"record {i} never consumed: lost wake-up")
    ring.close()


def test_sleeping_consumer_wakes_when_another_process_writes(shm_dir):
    parent_end, child_end = SPAWN.Pipe()
    with Doorbell.create() as bell:
        ring = StepRing.create(os.path.join(shm_dir, "wake"), LAYOUT, 64, doorbell=bell)
        ring.max_sleep_slice_s = 10 * WAKE_DEADLINE_S  # only the doorbell can end a sleep in time
        producer = SPAWN.Process(target=stamping_producer, args=(ring.path, child_end), daemon=True)
        producer.start()
        reduction.send_handle(parent_end, bell.fileno(), producer.pid)
        latencies_us = []
        try:
            for _ in range(WAKEUPS):
                assert ring.wait_readable(timeout_s=2 * WAKE_DEADLINE_S), "wake-up lost"
                latencies_us.append((time.perf_counter_ns() - ring.read_batch(1)["weights_seq_no"][0]) / 1e3)
        finally:
            producer.join(WAKE_DEADLINE_S)
            producer.terminate()
        assert producer.exitcode == 0
        ring.close()
        ring.unlink()
    assert len(latencies_us) == WAKEUPS


# ---------------------------------------------------------------- space doorbell wake-up across processes

SPACE_WAKEUPS = 1000


def jittery_consumer(path, space_fd):
    """Child: read the SPACE_WAKEUPS numbered records one at a time, each after a random
    busy-wait, so each read lands anywhere in the producer's arm/re-check/sleep sequence."""
    space = Doorbell.from_fd(space_fd.detach())
    ring = StepRing.attach(path, LAYOUT, role="consumer", space_doorbell=space)
    jitter = np.random.default_rng(1).uniform(0, 30e-6, SPACE_WAKEUPS)
    deadline = time.monotonic() + 4 * WAKE_DEADLINE_S
    for i in range(SPACE_WAKEUPS):
        jitter_end = time.perf_counter() + jitter[i]
        while time.perf_counter() < jitter_end:
            pass
        while not ring.readable_records():
            if time.monotonic() > deadline:
                raise SystemExit(f"record {i} never written")
        assert_numbered(ring.read_batch(1), i)
    ring.close()


def test_producer_waiting_for_space_wakes_when_another_process_reads(shm_dir):
    with Doorbell.create() as space:
        ring = StepRing.create(os.path.join(shm_dir, "space"), LAYOUT, 1, space_doorbell=space)
        ring.max_sleep_slice_s = 10 * WAKE_DEADLINE_S  # only the doorbell can end a sleep in time
        consumer = SPAWN.Process(target=jittery_consumer, daemon=True,
                                 args=(ring.path, reduction.DupFd(space.fileno())))
        consumer.start()
        try:
            for i in range(SPACE_WAKEUPS):  # capacity 1: every write after the first waits for a read
                assert ring.write_batch(numbered(i, 1), timeout_s=WAKE_DEADLINE_S) == 1, "wake-up lost"
        finally:
            consumer.join(WAKE_DEADLINE_S)
            consumer.terminate()
        assert consumer.exitcode == 0
        assert ring.producer_sleeps <= SPACE_WAKEUPS  # at most one announced wait per write: no polling
        ring.close()
        ring.unlink()
