"""An endless open run is cut into bounded segments (memory stays bounded)."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.daemon.connector.segments import SegmentAssembler
from rlinkd.shm.records import FINAL_OBS, StepLayout


def steps(n: int, start: int, stream: int = 3) -> np.ndarray:
    rec = np.zeros(n, StepLayout.flat(4, 1, 2).dtype)
    rec["stream_id"] = stream
    rec["ingest_id"] = np.arange(start, start + n)
    rec["obs"]["obs"][:, 0] = np.arange(start, start + n)
    rec["reward"] = 1.0
    return rec


def test_open_run_longer_than_the_limit_becomes_a_cut_segment():
    asm = SegmentAssembler(max_open_steps=100)
    assert asm.add(steps(60, 1)) == []
    done = asm.add(steps(60, 61))
    assert len(done) == 1
    seg = done[0]
    assert seg.num_steps == 119 and not seg.terminated and not seg.truncated
    assert seg.obs["obs"][-1, 0] == 120  # bootstrap from the obs of the record kept open
    assert asm.open_steps() == 1
    end = steps(1, 121)
    end["flags"] = FINAL_OBS
    (tail,) = asm.add(end)
    assert tail.num_steps == 1 and tail.obs["obs"][0, 0] == 120  # continuation starts there


@pytest.mark.parametrize("limit", [10_000, 25])
def test_many_interleaved_streams_give_each_stream_its_own_runs_in_order(limit):
    """Random episodes of 40 streams, interleaved and read in random chunks (the pool is
    compacted on the way; with a limit of 25, long runs are cut): every segment is one
    stream's consecutive records, every record is in one segment (a cut's last record also
    begins the next), and no stream keeps more than the limit open after a batch."""
    rng = np.random.default_rng(5)
    streams = {s: [] for s in range(40)}
    for s in streams:
        for length in rng.integers(1, 60, size=8):
            streams[s] += [False] * int(length) + [True]  # steps, then FINAL_OBS
    order = np.concatenate([[s] * len(v) for s, v in streams.items()])
    rng.shuffle(order)  # (each stream's own records stay in order below)
    rec = np.zeros(len(order), StepLayout.flat(4, 1, 2).dtype)
    rec["stream_id"], rec["ingest_id"] = order, np.arange(1, len(order) + 1)
    pos = {s: 0 for s in streams}
    for i, s in enumerate(order):
        rec["flags"][i] = FINAL_OBS if streams[s][pos[s]] else 0
        pos[s] += 1
    asm, got, at = SegmentAssembler(max_open_steps=limit), [], 0
    while at < len(rec):
        n = int(rng.integers(1, 90))
        got += asm.add(rec[at:at + n])
        at += n
        alive = asm.pool["stream_id"][:asm.n][asm.alive[:asm.n]]
        assert np.bincount(alive).max(initial=0) <= limit
    assert asm.open_steps() == 0 and asm.n < 1024  # compacted: nothing left open
    finals = set(rec["ingest_id"][(rec["flags"] & FINAL_OBS) != 0].tolist())
    cuts = sum(1 for seg in got if int(seg.ingest_ids[-1]) not in finals)  # (its last record stays open)
    assert sum(len(seg.ingest_ids) for seg in got) == len(rec) + cuts and (cuts > 0) == (limit < 100)
    for seg in got:
        mine = rec["ingest_id"][rec["stream_id"] == seg.stream_id]
        first = int(np.flatnonzero(mine == seg.ingest_ids[0])[0])
        assert list(seg.ingest_ids) == list(mine[first:first + len(seg.ingest_ids)])
