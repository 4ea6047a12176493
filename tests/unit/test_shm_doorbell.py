"""Doorbell: eventfd ring/drain/wait semantics and fd passing over SCM_RIGHTS."""

import os
import socket
import threading
import time

import pytest

from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.errors import ShmError


@pytest.fixture
def doorbell():
    bell = Doorbell.create()
    yield bell
    bell.close()


def test_wait_times_out_when_nobody_rings(doorbell):
    started = time.monotonic()
    assert doorbell.wait(0.05) is False
    assert time.monotonic() - started >= 0.045


def test_rings_coalesce_and_drain_resets(doorbell):
    for _ in range(3):
        doorbell.ring()
    assert doorbell.drain() == 3
    assert doorbell.drain() == 0
    doorbell.ring()
    assert doorbell.wait(1.0) is True
    assert doorbell.wait(0.0) is False  # wait() drained it


def test_wait_wakes_on_a_ring_from_another_thread(doorbell):
    ringer = threading.Timer(0.05, doorbell.ring)
    ringer.start()
    started = time.monotonic()
    assert doorbell.wait(10.0) is True
    assert time.monotonic() - started < 5.0
    ringer.join()


def test_fd_received_over_scm_rights_rings_the_same_counter(doorbell):
    sender, receiver = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with sender, receiver:
        socket.send_fds(sender, [b"bell"], [doorbell.fileno()])
        _, fds, _, _ = socket.recv_fds(receiver, 16, 1)
    remote = Doorbell.from_fd(fds[0])
    assert remote.fileno() != doorbell.fileno()
    remote.ring()
    assert doorbell.wait(1.0) is True
    remote.close()
    remote.close()
    with pytest.raises(ValueError, match="closed"):
        remote.fileno()


def test_from_fd_refuses_something_that_is_not_an_eventfd():
    read_end, write_end = os.pipe()
    with pytest.raises(ShmError, match=r"is 'pipe:\[\d+\]', not an eventfd doorbell"):
        Doorbell.from_fd(read_end)
    os.close(read_end)
    os.close(write_end)


def test_close_releases_the_fd():
    bell = Doorbell.create()
    fd = bell.fileno()
    bell.close()
    with pytest.raises(OSError):
        os.fstat(fd)
