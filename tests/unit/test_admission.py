"""daemon.collector.admission: the pending cap, oldest-first eviction, refusal, counters;
and client_lib treating an eviction as worth a reconnect."""
from __future__ import annotations

import socket

import pytest

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.transport import EVICTED, RLlinkClient, ServerError
from rlinkd.daemon.collector.admission import Admission, Verdict


def fill(adm: Admission, ids, handshake: bool = False) -> None:
    for cid in ids:
        assert adm.arrive(cid).admitted
        if handshake:
            assert adm.handshake_done(cid)


def test_a_flood_of_silent_connections_evicts_the_oldest_and_a_newcomer_always_gets_in():
    adm = Admission(max_connections=10, max_pending=4)
    fill(adm, range(1, 5))
    assert adm.arrive(5) == Verdict(admitted=True, evict=(1,))
    assert adm.arrive(6) == Verdict(admitted=True, evict=(2,))
    assert list(adm.pending) == [3, 4, 5, 6] and adm.evictions == 2
    for cid in range(7, 1007):  # a thousand more silent sockets: the pending places never grow
        assert adm.arrive(cid).admitted
    assert len(adm.pending) == 4 and adm.open == 4 and adm.evictions == 1002


def test_a_real_client_that_handshakes_in_time_keeps_its_place_through_the_flood():
    adm = Admission(max_connections=10, max_pending=3)
    fill(adm, [100, 101, 102])
    assert adm.arrive(1).evict == (100,)  # the real client, newest
    assert adm.handshake_done(1)
    for cid in range(200, 300):
        assert 1 not in adm.arrive(cid).evict
    assert 1 in adm.established and adm.open == 4


def test_full_places_evict_a_pending_connection_before_refusing():
    adm = Admission(max_connections=4, max_pending=4)
    fill(adm, [1, 2, 3], handshake=True)
    fill(adm, [4])
    assert adm.arrive(5) == Verdict(admitted=True, evict=(4,))  # total full: the pending one goes
    assert adm.handshake_done(5)
    assert adm.arrive(6) == Verdict(admitted=False)  # only handshaken ones: refuse, evict nobody
    assert adm.refusals == 1 and adm.open == 4 and not adm.pending


def test_pending_cap_and_total_cap_can_both_evict_for_one_newcomer():
    adm = Admission(max_connections=5, max_pending=2)
    fill(adm, [1, 2, 3], handshake=True)
    fill(adm, [4, 5])
    assert adm.arrive(6) == Verdict(admitted=True, evict=(4,))
    assert adm.open == 5


def test_pending_cap_never_exceeds_max_connections():
    adm = Admission(max_connections=2, max_pending=64)
    assert adm.max_pending == 2
    fill(adm, [1, 2])
    assert adm.arrive(3).evict == (1,)


def test_evicted_connection_cannot_complete_its_handshake_later():
    adm = Admission(max_connections=10, max_pending=1)
    fill(adm, [1])
    adm.arrive(2)
    assert not adm.handshake_done(1)  # evicted while its message was read
    assert adm.open == 1 and 1 not in adm.established


def test_leave_frees_a_place_and_is_idempotent():
    adm = Admission(max_connections=2, max_pending=2)
    fill(adm, [1], handshake=True)
    fill(adm, [2])
    adm.leave(1)
    adm.leave(1)
    adm.leave(2)
    adm.leave(99)
    assert adm.open == 0
    fill(adm, [3, 4], handshake=True)
    assert not adm.arrive(5).admitted


def test_timeouts_count_only_pending_connections_and_report_has_every_figure():
    adm = Admission(max_connections=4, max_pending=2)
    fill(adm, [1, 2])
    fill(adm, [3])  # evicts 1
    adm.timed_out(2)
    adm.timed_out(1)  # already evicted: not a timeout
    adm.leave(2)
    assert adm.report() == {"pending_connections": 1, "handshake_timeouts": 1,
                            "evicted_connections": 1, "refused_connections": 0}


@pytest.mark.parametrize(("message", "retry"), [(f"{EVICTED} too many connections waiting", True),
                                                ("daemon shutting down: SIGTERM", True),
                                                ("too many connections", False), ("wrong token", False)])
def test_client_lib_reconnects_after_an_eviction_but_not_after_a_refusal(message, retry):
    ours, theirs = socket.socketpair()
    client = RLlinkClient("tcp://127.0.0.1:1")
    client.sock = ours
    theirs.sendall(codec.encode(codec.Error(message=message)))
    with pytest.raises(ServerError) as caught:
        client.recv()
    assert caught.value.retry is retry
    client.close()
    theirs.close()
