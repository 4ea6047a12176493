"""Tier 1: the collector side of shared-memory agent slots (``ShmClients``): slots become
streams, episodes are accounted per slot, a slot beyond the limit refuses the client."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from rlinkd.client_lib.protocol.records import concat_records
from rlinkd.daemon.collector.core import single_policy
from rlinkd.daemon.collector.ingest import InvalidEpisode
from rlinkd.daemon.collector.shm_clients import ShmClients
from rlinkd.shm.records import TERMINATED
from tests.process.test_fuzz_shm import LAYOUT, SPACES, client_side, valid_records

SESSION_STREAM = 7


def clients(max_agents: int = 8) -> ShmClients:
    c = ShmClients("slots", single_policy(SPACES, LAYOUT), max_agents, itertools.count(100).__next__)
    c.attach(1, SESSION_STREAM, "default", 1024)
    return c


def fragment(slot: int, steps: int, reward: float, done: bool) -> np.ndarray:
    rec = valid_records(steps)
    rec["stream_id"] = slot
    rec["reward"][:steps] = reward
    if done:
        rec["flags"][steps] |= TERMINATED
    return rec


def write(c: ShmClients, *parts: np.ndarray) -> np.ndarray:
    producer = client_side(c.sessions[1].rings["default"].ring)
    producer.write_batch(concat_records(list(parts), LAYOUT.dtype))
    producer.close()
    return c.read(1, "default", 1 << 14)


def test_slot_zero_is_the_connections_stream_and_other_slots_get_streams_of_their_own():
    c = clients()
    rec = write(c, fragment(0, 2, 1.0, False), fragment(3, 2, 1.0, False), fragment(0, 1, 1.0, True))
    assert list(rec["stream_id"]) == [SESSION_STREAM] * 3 + [100] * 3 + [SESSION_STREAM] * 2
    rec = write(c, fragment(3, 1, 1.0, True), fragment(5, 1, 1.0, False))
    assert list(rec["stream_id"]) == [100, 100, 101, 101]       # slot 3 keeps its stream
    assert sorted(c.streams(1)) == [("default", SESSION_STREAM), ("default", 100), ("default", 101)]
    c.close()


def test_episodes_are_summed_per_slot_across_reads():
    c = clients()
    write(c, fragment(0, 3, 1.0, False), fragment(2, 2, 10.0, False))
    write(c, fragment(2, 1, 10.0, True), fragment(0, 2, 1.0, True))
    done = sorted((p, r, n) for p, r, n in c.sessions[1].done_episodes)
    assert done == [("default", 5.0, 5), ("default", 30.0, 3)]
    c.close()


def test_a_slot_beyond_the_limit_refuses_the_client():
    c = clients(max_agents=4)
    with pytest.raises(InvalidEpisode, match=r"agent slot 4 is not below "
                                             r"server\.max_agents_per_connection=4"):
        write(c, fragment(4, 1, 1.0, False))
    with pytest.raises(InvalidEpisode):                          # refused from then on
        c.read(1, "default", 16)
    assert c.readable() == []
    c.close()
