"""daemon.ipc inboxes with the registered daemon.messages (one process, a real socketpair)."""
from __future__ import annotations

import dataclasses
import time

import pytest

from rlinkd.daemon import ipc
from rlinkd.daemon import messages as m
from rlinkd.daemon.ipc import Inbox, InboxFull

SAMPLES = [
    m.Stop(reason="sigterm"), m.Reload(changes={"ppo.lr": 0.001, "daemon.log_level": "debug"}),
    m.WeightsPublished(seq_no=7, cutoff_ingest_id=1234, trained=True,
                       stats={"loss": 0.5, "kl": [0.1, 0.2]}),
    m.ConnectorStats(dropped_episodes=1, dropped_steps=20, batches=3, buffered_steps=5,
                     trained_steps=4096),
    m.DaemonInfo(info={"children": {"learner": {"pid": 1}}}), m.Drain(reason="shutdown"),
    m.BatchReady(slot=1), m.SnapshotRequest(request_id=9),
    m.CheckpointRequest(request_id=2, reason="periodic"),
    m.SnapshotReady(request_id=2, generation=5, seq_no=7, ok=False, error="boom"),
    m.Listening(host="127.0.0.1", port=5555, unix_socket="/run/rlinkd.sock"),
    m.CollectorStatus(status={"clients": 2}),
    m.CheckpointDone(request_id=2, reason="sigusr1", ok=True, path="/x/ckpt-000001", seq_no=7,
                     error=""),
    m.LearnerReady(seq_no=0, resumed_from=""),
]


@pytest.fixture
def inbox():
    box = Inbox("test")
    yield box
    box.close()


def test_every_registered_message_has_a_sample():
    assert {type(s).__name__ for s in SAMPLES} == {
        name for name, cls in ipc._REGISTRY.items() if cls.__module__ == m.__name__}


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda s: type(s).__name__)
def test_send_recv_round_trip(inbox, msg):
    inbox.send(msg)
    got = inbox.recv(timeout_s=5.0)
    assert type(got) is type(msg) and got == msg
    assert dataclasses.is_dataclass(got)


def test_drain_returns_everything_in_order(inbox):
    for msg in SAMPLES:
        inbox.send(msg)
    assert inbox.drain() == SAMPLES
    assert inbox.drain() == []


def test_blocking_recv_gets_a_waiting_message(inbox):
    inbox.send(m.BatchReady(slot=0))
    assert inbox.recv() == m.BatchReady(slot=0)   # timeout None: blocks, but data is there


def test_recv_timeout_returns_none(inbox):
    start = time.monotonic()
    assert inbox.recv(timeout_s=0.05) is None
    assert time.monotonic() - start >= 0.045
    assert inbox.recv(timeout_s=0) is None and inbox.recv(timeout_s=-1) is None


def test_messages_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.Stop(reason="x").reason = "y"  # type: ignore[misc]


def test_inbox_full_when_nobody_reads(inbox):
    sent = 0
    while inbox.try_send(m.BatchReady(slot=sent)):
        sent += 1
        assert sent < 1_000_000, "inbox never filled up"
    assert sent > 0
    start = time.monotonic()
    with pytest.raises(InboxFull, match="inbox test is full"):
        inbox.send(m.BatchReady(slot=-1), timeout_s=0.05)
    assert time.monotonic() - start >= 0.045
    with pytest.raises(InboxFull):
        inbox.send(m.BatchReady(slot=-1), timeout_s=0)
    assert issubclass(InboxFull, TimeoutError)
    # nothing was lost or duplicated, and reading makes room again
    received = inbox.drain()
    assert [r.slot for r in received] == list(range(sent))
    inbox.send(m.BatchReady(slot=-2), timeout_s=1.0)
    assert inbox.recv(timeout_s=1.0) == m.BatchReady(slot=-2)


def test_encode_decode_directly():
    data = ipc.encode(m.Listening(host="::1", port=0, unix_socket="s"))
    assert b'"kind":"Listening"' in data
    assert ipc.decode(data) == m.Listening(host="::1", port=0, unix_socket="s")
    with pytest.raises(KeyError):
        ipc.decode(b'{"kind": "NoSuchMessage"}')


def test_dispatch_by_type():
    seen = []
    handlers = {m.Stop: lambda msg: seen.append(("stop", msg.reason)),
                m.BatchReady: lambda msg: seen.append(("batch", msg.slot))}
    ipc.dispatch(handlers, m.BatchReady(slot=3))
    ipc.dispatch(handlers, m.Stop(reason="r"))
    assert seen == [("batch", 3), ("stop", "r")]
    with pytest.raises(KeyError):
        ipc.dispatch(handlers, m.Drain(reason="x"))


def test_fileno_is_the_receiving_end(inbox):
    import select
    assert select.select([inbox.fileno()], [], [], 0)[0] == []
    inbox.send(m.Stop(reason="x"))
    assert select.select([inbox.fileno()], [], [], 1.0)[0] == [inbox.fileno()]
