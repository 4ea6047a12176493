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
from rlinkd.shm.records import FINAL_OBS, TERMINATED, TRUNCATED
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


def reference_episodes(rec: np.ndarray, open_state: dict) -> list[tuple[float, int]]:
    """A per-record loop: what the vectorised accounting must equal."""
    done = []
    for slot, flags, reward in zip(rec["stream_id"].tolist(), rec["flags"].tolist(),
                                   rec["reward"].tolist()):
        ret, length = open_state.get(slot, (0.0, 0))
        ret, length = ret + reward, length + (0 if flags & FINAL_OBS else 1)
        if flags & FINAL_OBS and flags & (TERMINATED | TRUNCATED):
            done.append((ret, length))
            ret, length = 0.0, 0
        open_state[slot] = (ret, length)
    return done


@pytest.mark.parametrize("n_slots", [1, 5])
def test_per_slot_accounting_equals_a_record_by_record_loop(n_slots):
    c, rng, state = clients(), np.random.default_rng(n_slots), {}
    producer = client_side(c.sessions[1].rings["default"].ring)
    expected = []
    for _ in range(20):
        n = int(rng.integers(1, 200))
        rec = LAYOUT.empty(n)
        rec["stream_id"] = rng.integers(0, n_slots, n)
        final = rng.random(n) < 0.2
        rec["flags"] = np.where(final, FINAL_OBS | rng.choice([0, TERMINATED, TRUNCATED], n), 0)
        rec["reward"] = np.where(final, 0.0, rng.integers(-3, 4, n))
        expected += reference_episodes(rec, state)
        producer.write_batch(rec)
        c.read(1, "default", 1024)
    got = [(r, n) for _, r, n in c.sessions[1].done_episodes]
    assert sorted(got) == sorted(expected) and len(expected) > 10
    pr = c.sessions[1].rings["default"]
    for slot, (ret, length) in state.items():
        assert (pr.open_return[slot], pr.open_length[slot]) == (ret, length)
    producer.close()
    c.close()
