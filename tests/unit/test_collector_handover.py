"""daemon.collector: handing a serving connection to the inference role over the area
channel (serving.py ``_pass``, channel_outbox.py)."""
from __future__ import annotations

import asyncio
import os
import socket

from rlinkd.daemon.collector.channel_outbox import ChannelOutbox
from rlinkd.daemon.collector.serving import ServingFront
from rlinkd.daemon.serving import channel


def front_on(channel_end: socket.socket, max_waiting: int = 4096) -> ServingFront:
    """A ServingFront with only what ``_pass`` uses (its outbox and counts)."""
    front = ServingFront.__new__(ServingFront)
    front.outbox = ChannelOutbox(channel_end, max_waiting)
    front.counts = {"shm_clients": 0, "direct_handed_over": 0, "handover_failed": 0, "tls_relays": 0}
    return front


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fill(sock: socket.socket) -> int:
    """Send datagrams until the peer's queue is full; how many went."""
    n = 0
    while True:
        try:
            sock.send(b'{"op": "filler"}')
        except BlockingIOError:
            return n
        n += 1


def test_a_connection_reaches_the_role_with_its_prefix():
    ours, role = (socket.socket(fileno=fd) for fd in channel.make_pair())
    conn, peer = socket.socketpair()
    front = front_on(ours)
    before = open_fds()
    assert front._pass(conn.fileno(), b"00000002{}", ready=False)
    assert open_fds() == before  # (the copies sent are closed here)
    msg = channel.receive(role)
    assert msg is not None and msg.op == "direct" and not msg.ready and len(msg.fds) == 2
    assert channel.read_prefix(msg.fds[1]) == b"00000002{}"
    os.close(msg.fds[0])
    assert front.counts["direct_handed_over"] == 1
    for sock in (ours, role, conn, peer):
        sock.close()


def test_a_full_channel_delays_hand_overs_in_order_and_loses_none():
    async def scenario() -> list:
        ours, role = (socket.socket(fileno=fd) for fd in channel.make_pair())
        fillers = fill(ours)
        pairs = [socket.socketpair() for _ in range(3)]
        front = front_on(ours)
        before = open_fds()
        for i, (conn, _peer) in enumerate(pairs):
            assert front._pass(conn.fileno(), b"%d" % i, ready=False)
        assert len(front.outbox.waiting) == 3 and front.outbox.watching
        got = []
        for _ in range(200):  # (the role reads; the outbox's writer sends what waited)
            role.setblocking(False)
            while True:
                try:
                    _data, fds, _flags, _ = socket.recv_fds(role, 4096, 2)
                except BlockingIOError:
                    break
                if fds:
                    got.append(channel.read_prefix(fds[1]))
                    os.close(fds[0])
            if len(got) == 3:
                break
            await asyncio.sleep(0.01)
        assert not front.outbox.waiting and not front.outbox.watching and fillers > 0
        assert open_fds() == before
        for sock in (ours, role, *(s for pair in pairs for s in pair)):
            sock.close()
        return got

    assert asyncio.run(scenario()) == [b"0", b"1", b"2"]


def test_a_stalled_role_gets_no_more_than_max_waiting():
    async def scenario() -> None:
        ours, role = (socket.socket(fileno=fd) for fd in channel.make_pair())
        fill(ours)
        conn, peer = socket.socketpair()
        front = front_on(ours, max_waiting=1)
        assert front._pass(conn.fileno(), b"", ready=True)
        before = open_fds()
        assert not front._pass(conn.fileno(), b"x", ready=False)
        assert open_fds() == before and front.counts["handover_failed"] == 1
        assert front.outbox.send(channel.ChannelMessage("close", 7))  # (areas' messages: no bound)
        front.outbox.close()  # (what waited goes, its copies closed; nothing is taken after)
        assert open_fds() == before - 1 and not front.outbox.send(channel.ChannelMessage("reset"))
        for sock in (ours, role, conn, peer):
            sock.close()

    asyncio.run(scenario())
