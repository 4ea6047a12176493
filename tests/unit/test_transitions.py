"""connector.transitions: n-step returns and replay rows against hand-computed values."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.daemon.connector.segments import Segment
from rlinkd.daemon.connector.transitions import nstep_returns, segments_to_rows
from rlinkd.shm.records import StepLayout
from rlinkd.shm.replay import ReplayLayout


def test_nstep_returns_by_hand():
    # rewards 1 2 3 4, gamma 0.5, n 2:  R = 1+.5*2, 2+.5*3, 3+.5*4, 4
    returns, discount, horizon = nstep_returns(np.array([1.0, 2.0, 3.0, 4.0]), True, 2, 0.5)
    assert returns.tolist() == [2.0, 3.5, 5.0, 4.0]
    assert horizon.tolist() == [2, 2, 2, 1]
    assert discount.tolist() == [0.25, 0.25, 0.0, 0.0]  # windows reaching a terminal end: 0
    _, discount, _ = nstep_returns(np.array([1.0, 2.0, 3.0, 4.0]), False, 2, 0.5)
    assert discount.tolist() == [0.25, 0.25, 0.25, 0.5]  # cut or truncated: bootstrap, shorter
    returns, discount, _ = nstep_returns(np.array([1.0, 1.0]), False, 1, 0.9)
    assert returns.tolist() == [1.0, 1.0] and discount.tolist() == pytest.approx([0.9, 0.9])


def segment(rewards, terminated: bool, layout: StepLayout) -> Segment:
    steps = len(rewards)
    obs = layout.empty(steps + 1)["obs"]
    obs["obs"] = np.arange(steps + 1, dtype=np.float32)[:, None]
    return Segment(stream_id=0, obs=obs, actions=np.arange(steps, dtype=np.float32)[:, None],
                   rewards=np.asarray(rewards, np.float32), logp=np.zeros(steps, np.float32),
                   has_logp=np.zeros(steps, bool), terminated=terminated, truncated=not terminated,
                   behaviour_seq_no=7, ingest_ids=np.arange(steps + 1))


def test_rows_pair_each_step_with_its_bootstrap_observation():
    step = StepLayout.flat(2, 1, 2)
    layout = ReplayLayout(step)
    rows = segments_to_rows([segment([1, 2, 3], True, step), segment([], False, step),
                             segment([5], False, step)], 3, 0.5, layout)
    assert len(rows) == 4 and rows.dtype == layout.dtype
    assert rows["obs"]["obs"][:, 0].tolist() == [0, 1, 2, 0]
    assert rows["next_obs"]["obs"][:, 0].tolist() == [3, 3, 3, 1]  # the segment end in 3 or fewer
    assert rows["reward"].tolist() == [1 + 1 + 0.75, 2 + 1.5, 3, 5]
    assert rows["discount"].tolist() == [0, 0, 0, 0.5]
    assert rows["action"][:, 0].tolist() == [0, 1, 2, 0] and (rows["seq_no"] == 7).all()
    assert len(segments_to_rows([], 3, 0.5, layout)) == 0
