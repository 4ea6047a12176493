"""BatchSlots: state machine, ordering by batch_seq, crash recovery, description checks."""

import multiprocessing as mp
import os
import signal

import numpy as np
import pytest

from rlinkd.shm.errors import LayoutError, ShmError
from rlinkd.shm.slots import FILLING, FREE, READY, SLOTS_HEADER, BatchSlots

SPAWN = mp.get_context("spawn")
COLUMNS = {"obs": ((4,), "float32"), "actions": ((), "int64"), "frames": ((2, 3), "uint8")}
META = ["weights_seq_no", "n_episodes"]


@pytest.fixture
def slots(shm_dir):
    slots = BatchSlots.create(os.path.join(shm_dir, "slots"), COLUMNS, capacity_rows=16, n_slots=3,
                              meta_fields=META)
    yield slots
    slots.close()


def test_columns_are_shared_views_of_the_declared_shapes(slots):
    learner = BatchSlots.attach(slots.path)
    slot = slots.acquire_free()
    columns = slots.columns(slot)
    assert {name: (a.shape, a.dtype.str) for name, a in columns.items()} == {
        "obs": ((16, 4), "<f4"), "actions": ((16,), "<i8"), "frames": ((16, 2, 3), "|u1")}
    columns["obs"][:5] = np.arange(20).reshape(5, 4)
    columns["actions"][:5] = [9, 8, 7, 6, 5]
    slots.mark_ready(slot, 5, {"weights_seq_no": 41, "n_episodes": 2})
    taken = learner.take_ready()
    assert taken == slot and learner.rows(slot) == 5
    assert learner.meta(slot) == {"weights_seq_no": 41, "n_episodes": 2}
    np.testing.assert_array_equal(learner.columns(slot)["obs"][:5], np.arange(20).reshape(5, 4))
    np.testing.assert_array_equal(learner.columns(slot)["actions"][:5], [9, 8, 7, 6, 5])
    assert learner.columns(slot)["obs"].ctypes.data % 64 == 0
    learner.close()


def test_full_cycle_and_oldest_ready_first(slots):
    acquired = [slots.acquire_free() for _ in range(3)]
    assert acquired == [0, 1, 2] and slots.acquire_free() is None
    for slot in (2, 0, 1):  # mark ready out of index order
        slots.mark_ready(slot, 1)
    assert [slots.batch_seq(s) for s in (2, 0, 1)] == [0, 1, 2]
    assert [slots.take_ready() for _ in range(3)] == [2, 0, 1]
    assert slots.take_ready() is None
    assert slots.in_training() == [2, 0, 1]
    slots.release(0)
    assert slots.state(0) == FREE and slots.acquire_free() == 0


def test_wrong_transitions_are_refused(slots):
    with pytest.raises(ShmError, match=r"slot 0 of .* is FREE, expected FILLING"):
        slots.mark_ready(0, 1)
    slot = slots.acquire_free()
    with pytest.raises(ShmError, match="is FILLING, expected TRAINING"):
        slots.release(slot)
    with pytest.raises(ValueError, match=r"rows 17 outside 0\.\.16"):
        slots.mark_ready(slot, 17)
    with pytest.raises(ValueError, match=r"unknown meta fields \['loss'\]"):
        slots.mark_ready(slot, 1, {"loss": 3})
    assert slots.state(slot) == FILLING
    with pytest.raises(IndexError):
        slots.rows(3)


def test_reset_filling_after_a_connector_restart(slots):
    first, second = slots.acquire_free(), slots.acquire_free()
    slots.mark_ready(first, 2)
    restarted = BatchSlots.attach(slots.path)
    assert restarted.reset_filling() == [second]
    assert [restarted.state(s) for s in range(3)] == [READY, FREE, FREE]
    assert restarted.mark_ready(restarted.acquire_free(), 1) == 1  # batch_seq continues
    restarted.close()


def doomed_learner(path, conn):
    """Child: takes the oldest READY slot, reports it, then waits to be SIGKILLed."""
    learner = BatchSlots.attach(path)
    conn.send(learner.take_ready())
    conn.recv()  # never arrives


def test_in_training_lists_slots_of_a_killed_learner(slots):
    for rows in (3, 4):
        slots.mark_ready(slots.acquire_free(), rows)
    parent_end, child_end = SPAWN.Pipe()
    learner = SPAWN.Process(target=doomed_learner, args=(slots.path, child_end))
    learner.start()
    assert parent_end.poll(60), "learner did not start"
    taken = parent_end.recv()
    os.kill(learner.pid, signal.SIGKILL)
    learner.join(10)
    assert learner.exitcode == -signal.SIGKILL
    successor = BatchSlots.attach(slots.path)
    assert successor.in_training() == [taken] and successor.rows(taken) == 3
    successor.release(taken)
    assert successor.in_training() == [] and successor.take_ready() == 1
    successor.close()


def test_attach_checks_header_and_description(slots):
    fields = list(SLOTS_HEADER.unpack_from(slots.segment.buf, 0))
    SLOTS_HEADER.pack_into(slots.segment.buf, 0, *fields[:2], 4, *fields[3:])
    with pytest.raises(LayoutError, match=r"n_slots \(header vs description\) mismatch in .*: header has 4"):
        BatchSlots.attach(slots.path)
    SLOTS_HEADER.pack_into(slots.segment.buf, 0, b"RLKSLOTZ", *fields[1:])
    with pytest.raises(LayoutError, match=r"bad magic b'RLKSLOTZ' .*not an rlinkd batch slots segment"):
        BatchSlots.attach(slots.path)
    SLOTS_HEADER.pack_into(slots.segment.buf, 0, *fields[:5], fields[5] - 3, *fields[6:])
    with pytest.raises(LayoutError, match="unreadable column description"):
        BatchSlots.attach(slots.path)


def test_create_validates_its_arguments(shm_dir):
    path = os.path.join(shm_dir, "bad")
    with pytest.raises(ValueError, match="not a plain numeric dtype"):
        BatchSlots.create(path, {"x": ((), "O")}, 4, 2)
    with pytest.raises(ValueError, match="meta_fields"):
        BatchSlots.create(path, {"x": ((), "f4")}, 4, 2, meta_fields=[f"m{i}" for i in range(9)])
    assert os.listdir(shm_dir) == []
