"""An endless open run is cut into bounded segments (memory stays bounded)."""
from __future__ import annotations

import numpy as np

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
