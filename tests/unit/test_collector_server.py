"""daemon.collector.server helpers on a real event loop: the shutdown goodbye and the
episode-ring wait for space (no sockets, no processes)."""
from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time

import pytest

from rlinkd.daemon.collector.server import say_goodbye_to_all, wait_for_space
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.records import StepLayout
from rlinkd.shm.ring import StepRing

LAYOUT = StepLayout.flat(2, 1, 2)


class FakeTransport:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


class FakeWriter:
    """A StreamWriter whose peer reads (``drain`` returns) or never reads (``drain`` hangs)."""

    def __init__(self, reads: bool) -> None:
        self.reads, self.written, self.closed = reads, b"", False
        self.transport = FakeTransport()

    def write(self, data: bytes) -> None:
        self.written += data

    async def drain(self) -> None:
        if not self.reads:
            await asyncio.Event().wait()

    def close(self) -> None:
        self.closed = True


def test_goodbye_to_100_stalled_clients_takes_one_deadline_not_one_each():
    stalled = [FakeWriter(reads=False) for _ in range(100)]
    polite = FakeWriter(reads=True)
    timeout_s = 0.2

    async def main() -> float:
        started = time.monotonic()
        await asyncio.wait_for(say_goodbye_to_all([(w, b"bye") for w in [*stalled, polite]], timeout_s), 30.0)
        return time.monotonic() - started

    elapsed = asyncio.run(main())
    assert elapsed < 10 * timeout_s  # one at a time would take 100 deadlines
    assert polite.written == b"bye" and polite.closed and not polite.transport.aborted
    assert all(w.written == b"bye" and w.transport.aborted for w in stalled)


@pytest.fixture
def shm_dir():
    directory = tempfile.mkdtemp(prefix="rlkt-coll-", dir="/dev/shm")
    yield directory
    shutil.rmtree(directory)


def test_wait_for_space_sleeps_once_until_the_consumer_frees_space(shm_dir):
    with Doorbell.create() as space:
        producer = StepRing.create(os.path.join(shm_dir, "r"), LAYOUT, 8, space_doorbell=space)
        consumer = StepRing.attach(producer.path, role="consumer", space_doorbell=space)
        producer.max_sleep_slice_s = 600.0  # only a doorbell ring can end the sleep within the test
        producer.write_batch(LAYOUT.empty(8))

        def consume_once_waited() -> None:
            deadline = time.monotonic() + 30.0
            while not producer.header()["writer_waiting"] and time.monotonic() < deadline:
                time.sleep(0.001)
            consumer.read_batch(3)

        thread = threading.Thread(target=consume_once_waited)
        thread.start()
        asyncio.run(asyncio.wait_for(wait_for_space(producer), 30.0))
        thread.join()
        assert producer.free_records() == 3 and producer.producer_sleeps == 1
        assert producer.header()["writer_waiting"] == 0
        consumer.close()
        producer.close()
