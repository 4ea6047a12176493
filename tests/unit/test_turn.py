"""The serving turn's stages (daemon/inference/turn.py) on hand-made lanes: the ordering rules
past bugs broke (old weights after a sample cut; a START taking a slot before an END freed one)
as properties of the admit and order stages."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinkd.daemon.inference import turn
from rlinkd.daemon.inference.lonestep import MAX_RECORDS
from rlinkd.shm.lanes import EVALUATE, OP_END, OP_RELEASE, OP_START, OP_STEP

LANE = np.dtype([("op", "u1"), ("flags", "u4"), ("group", "u4"), ("group_size", "u4")])


def lanes_of(*rows):
    """(lanes, owner) from (op, flags, group, group_size, area) rows."""
    lanes = np.zeros(len(rows), LANE)
    for i, (op, flags, group, size, _) in enumerate(rows):
        lanes[i] = (op, flags, group, size)
    return lanes, np.array([r[4] for r in rows], np.int64)


def idx(*lanes):
    return np.array(lanes, np.int64)


def test_scan_looks_at_every_area_when_due_or_when_lanes_were_left_pending():
    moved = idx(3)
    assert turn.scan_scope(False, False, moved) is moved
    assert turn.scan_scope(True, False, moved) is None
    assert turn.scan_scope(False, True, moved) is None
    assert turn.scan_scope(False, False, None) is None


def test_gather_waits_two_forward_passes_at_most_and_not_for_what_arrived():
    assert turn.gather_limit_s(0.004, [1e-3, 3e-3]) == 0.004
    assert turn.gather_limit_s(0.004, [1e-4, 3e-4]) == pytest.approx(6e-4)
    assert turn.gather_limit_s(0.004, []) == 0.0
    assert turn.gather_want(1e-3, max_batch=8, open_lanes=4, arrived=1) == 4
    assert turn.gather_want(1e-3, max_batch=8, open_lanes=20, arrived=1) == 8
    assert turn.gather_want(1e-3, max_batch=8, open_lanes=4, arrived=4) == 0
    assert turn.gather_want(turn.MIN_GATHER_S / 2, max_batch=8, open_lanes=4, arrived=1) == 0


def test_admit_answers_whole_groups_only():
    lanes, owner = lanes_of((OP_STEP, 0, 0, 0, 0), (OP_STEP, 0, 7, 2, 0), (OP_STEP, 0, 7, 2, 0),
                            (OP_STEP, 0, 7, 2, 1), (OP_STEP, 0, 5, 3, 1))
    closed = np.zeros(5, bool)
    got = turn.admit(lanes, owner, idx(0, 1, 2, 3, 4), False, closed, closed)
    assert got.tolist() == [0, 1, 2]  # area 1's group 7 lacks a member, group 5 two


def test_admit_while_held_lets_only_ends_releases_and_evaluation_go_on():
    """No training request is answered while the policy waits for weights trained on its
    cut sample (0d9aa3a, 7d34dfc)."""
    lanes, owner = lanes_of((OP_STEP, 0, 0, 0, 0), (OP_START, 0, 0, 0, 1), (OP_END, 0, 0, 0, 2),
                            (OP_RELEASE, 0, 0, 0, 3), (OP_START, EVALUATE, 0, 0, 4), (OP_STEP, 0, 0, 0, 5))
    open_ = np.array([1, 0, 1, 1, 0, 1], bool)
    evaluate = np.array([0, 0, 0, 0, 0, 1], bool)
    pending = idx(0, 1, 2, 3, 4, 5)
    assert turn.admit(lanes, owner, pending, True, open_, evaluate).tolist() == [2, 3, 4, 5]
    assert turn.admit(lanes, owner, pending, False, open_, evaluate).tolist() == [0, 1, 2, 3, 4, 5]


def test_admit_while_held_keeps_a_group_whole():
    lanes, owner = lanes_of((OP_END, 0, 4, 2, 0), (OP_STEP, 0, 4, 2, 0), (OP_END, 0, 4, 2, 1), (OP_END, 0, 4, 2, 1))
    open_ = np.ones(4, bool)
    got = turn.admit(lanes, owner, idx(0, 1, 2, 3), True, open_, np.zeros(4, bool))
    assert got.tolist() == [2, 3]  # area 0's group has a training STEP: it waits whole


def test_route_takes_the_native_step_up_to_its_budget():
    assert turn.route_natively(1, 3e-6, True)
    assert not turn.route_natively(1, 3e-6, False)
    assert turn.route_natively(turn.NATIVE_MIN_REQUESTS, 1.0, True)
    assert not turn.route_natively(turn.NATIVE_MIN_REQUESTS + 1, 1.0, True)


def test_order_puts_every_end_before_a_start_and_keeps_scan_order_otherwise():
    """An END gives back its agent slot before a START of the same turn takes one (a0d4ec0)."""
    lanes, _ = lanes_of((OP_START, 0, 0, 0, 0), (OP_STEP, 0, 0, 0, 1), (OP_END, 0, 0, 0, 2),
                        (OP_START, 0, 0, 0, 3), (OP_END, 0, 0, 0, 4))
    order, grouped = turn.lone_order(lanes, idx(0, 1, 2, 3, 4))
    assert order.tolist() == [2, 4, 0, 1, 3] and order.dtype == np.int64
    assert len(grouped) == 0
    ops = lanes["op"][order]
    assert (np.flatnonzero(ops == OP_END).max() < np.flatnonzero(ops == OP_START).min())


def test_order_leaves_groups_of_several_to_the_batch_path_and_serves_groups_of_one():
    lanes, _ = lanes_of((OP_STEP, 0, 3, 2, 0), (OP_STEP, 0, 9, 1, 1), (OP_STEP, 0, 3, 2, 0), (OP_STEP, 0, 0, 0, 2))
    order, grouped = turn.lone_order(lanes, idx(0, 1, 2, 3))
    assert order.tolist() == [1, 3] and grouped.tolist() == [0, 2]
    one, none = turn.lone_order(lanes, idx(0))
    assert one.tolist() == [0] and len(none) == 0


def test_a_sample_cut_leaves_the_rest_of_the_turn_and_every_group_for_later():
    order, grouped = idx(5, 6, 7), np.array([1, 2], np.uint32)
    assert turn.after_cut(order, 1, grouped).tolist() == [6, 7, 1, 2]
    assert turn.after_cut(order, 3, grouped).tolist() == [1, 2]
    assert turn.after_cut(order, 3, grouped[:0]).tolist() == []


def test_a_native_run_stops_at_the_sample_boundary():
    assert turn.steps_to_boundary(128, 100, True) == 28
    assert turn.steps_to_boundary(128, 130, True) == 1
    assert turn.steps_to_boundary(128, 100, False) == MAX_RECORDS


ROWS = st.lists(st.tuples(st.sampled_from([OP_START, OP_STEP, OP_END, OP_RELEASE]), st.sampled_from([0, EVALUATE]),
                          st.integers(0, 3), st.integers(1, 3), st.integers(0, 2), st.booleans(), st.booleans()),
                min_size=1, max_size=24)


@settings(max_examples=200, deadline=None)
@given(ROWS, st.booleans())
def test_admit_never_lets_training_through_while_held_nor_splits_a_group(rows, held):
    lanes, owner = lanes_of(*(r[:5] for r in rows))
    open_ = np.array([r[5] for r in rows], bool)
    evaluate = np.array([r[6] for r in rows], bool)
    pending = np.arange(len(rows), dtype=np.int64)
    got = turn.admit(lanes, owner, pending, held, open_, evaluate)
    assert set(got.tolist()) <= set(pending.tolist())
    ops, flags = lanes["op"][got], lanes["flags"][got]
    if held:
        training = (((ops == OP_START) & ((flags & EVALUATE) == 0))
                    | ((ops == OP_STEP) & ~(open_[got] & evaluate[got])))
        assert not training.any()
    key = (owner << 32) | lanes["group"].astype(np.int64)
    for k in set(key[got][lanes["group"][got] != 0].tolist()):  # a group answered whole
        assert set(np.flatnonzero(key == k).tolist()) <= set(got.tolist())


@settings(max_examples=200, deadline=None)
@given(ROWS)
def test_lone_order_is_the_lone_lanes_with_every_end_first_in_scan_order(rows):
    lanes, _ = lanes_of(*(r[:5] for r in rows))
    idx_ = np.arange(len(rows), dtype=np.int64)
    order, grouped = turn.lone_order(lanes, idx_)
    assert sorted(order.tolist() + grouped.tolist()) == idx_.tolist()
    ends = order[lanes["op"][order] == OP_END].tolist()
    assert order.tolist() == ends + [i for i in order.tolist() if i not in ends]
    rest = [i for i in order.tolist() if i not in ends]
    assert ends == sorted(ends) and rest == sorted(rest)
    if len(rows) > 1:  # (a single request is lone whatever its group)
        several = (lanes["group"] != 0) & (lanes["group_size"] > 1)
        assert grouped.tolist() == np.flatnonzero(several).tolist()
