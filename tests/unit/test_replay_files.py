"""checkpoint.replay_files: a replay buffer saved in a checkpoint and refilled from it,
into a buffer of the same size and of a smaller one; a layout mismatch is refused."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.checkpoint.replay_files import replay_files, restore_replay
from rlinkd.daemon.errors import CheckpointError
from rlinkd.shm.records import StepLayout
from rlinkd.shm.replay import ReplayBuffer, ReplayLayout
from tests.unit.test_replay import rows_for

LAYOUT = ReplayLayout(StepLayout.flat(3, 1, 2))


def test_a_saved_buffer_refills_a_new_one(tmp_path):
    buf = ReplayBuffer.create(str(tmp_path / "a"), LAYOUT, 8)
    buf.append(rows_for(LAYOUT, np.arange(11)))
    ckpt = store.write_checkpoint(tmp_path / "ckpts", replay_files("default", buf), {"reason": "test"})
    same = ReplayBuffer.create(str(tmp_path / "b"), LAYOUT, 8)
    assert restore_replay(str(ckpt.path), "default", same) == 8
    assert same.written == 11 and sorted(same.rows["seq_no"].tolist()) == list(range(3, 11))
    small = ReplayBuffer.create(str(tmp_path / "c"), LAYOUT, 4)
    assert restore_replay(str(ckpt.path), "default", small) == 4
    assert sorted(small.rows["seq_no"].tolist()) == list(range(7, 11)) and small.written == 11
    assert restore_replay(str(ckpt.path), "red", same) == 0  # nothing saved for that policy
    other = ReplayBuffer.create(str(tmp_path / "d"), ReplayLayout(StepLayout.flat(5, 1, 2)), 8)
    with pytest.raises(CheckpointError, match="layout"):
        restore_replay(str(ckpt.path), "default", other)
