"""The native lone step (daemon/inference/lonestep.py, native/step.c) does exactly what the
Python path does: two inference servers with the same seeds, one serving lone requests
natively and one in Python, get the same random request sequences and must give the same
answers, the same step records and the same episode state."""
from __future__ import annotations

import os

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlinkd.daemon import policies as P
from rlinkd.daemon.config import load_config
from rlinkd.daemon.inference import netnative
from rlinkd.daemon.inference.backend import PolicyRunner
from rlinkd.daemon.inference.episodes import SlotPool
from rlinkd.daemon.inference.lonestep import LoneStepper
from rlinkd.daemon.inference.policy_lanes import ServedArea
from rlinkd.daemon.inference.policy_serving import PolicyServing
from rlinkd.daemon.inference.server import InferenceServer
from rlinkd.daemon.inference.turn import NATIVE_BUDGET_S, NATIVE_MAX_REQUESTS, NATIVE_MIN_REQUESTS, native_limit
from rlinkd.daemon.wiring import step_layout
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.lanes import (EVALUATE, OP_END, OP_RELEASE, OP_START, OP_STEP, TERMINATED, TRUNCATED, LaneArea,
                              LaneLayout)
from rlinkd.shm.records import FINAL_OBS
from rlinkd.shm.records import TERMINATED as REC_TERMINATED
from tests.unit.test_inference_server import FakeLink

pytestmark = pytest.mark.skipif(not netnative.available(), reason="the _native extension is not built")
LANES = 5
ANSWER = ("status", "action", "logp", "weights_seq_no", "resp_seq")
BOOK = ("open", "evaluate", "slot", "has_pending", "fragment_steps", "ret", "length")


class Twin:
    """One inference server over one lane area, natively or not."""

    def __init__(self, tmp, name: str, d, board, native: bool, on_policy: bool = False,
                 sample_steps: int = 5, lanes: int = LANES) -> None:
        runner = PolicyRunner("default", d.spec, d.obs_space, d.act_space, board, "native", seed=7)
        self.link = FakeLink(step_layout(d))
        self.policy = PolicyServing(runner, d.obs_space, SlotPool(), self.link, sample_steps=sample_steps)
        self.server = InferenceServer({"default": self.policy}, max_batch=64, max_wait_s=0.0,
                                      on_policy=on_policy)
        path = str(tmp / name)
        self.area = LaneArea.create(path, LaneLayout(step_layout(d)), lanes)
        fd = os.open(path, os.O_RDWR)
        self.server.add(ServedArea(0, self.area, "default", Doorbell.create()), fd)
        os.close(fd)
        self.natively = 0
        if not native:
            self.policy.lone = None
        else:
            assert isinstance(self.policy.lone, LoneStepper)
            serve = self.policy.lone.serve

            def counted(lanes, order, start, *rest):
                got = serve(lanes, order, start, *rest)
                self.natively += got[0] - start
                return got
            self.policy.lone.serve = counted  # type: ignore[method-assign]

    def request(self, lane: int, op: int, obs: np.ndarray, reward: float, flags: int) -> None:
        lanes = self.area.lanes
        lanes["obs"]["obs"][lane] = obs
        lanes["op"][lane], lanes["flags"][lane], lanes["reward"][lane] = op, flags, reward
        self.area.publish(lane)

    def close(self) -> None:
        self.server.close()


def make_board(tmp_path):
    d = P.policy_defs(load_config(None, []))["default"]
    board = WeightsBoard.create(str(tmp_path / "board"), d.spec.n_params(), orjson.dumps(d.spec.to_json()))
    board.publish(3, np.random.default_rng(0).normal(size=d.spec.n_params()).astype(np.float32) * 0.3)
    return d, board


@pytest.fixture
def twins(tmp_path):
    d, board = make_board(tmp_path)
    pair = Twin(tmp_path, "a", d, board, True), Twin(tmp_path, "b", d, board, False)
    yield pair
    for t in pair:
        t.close()


def same_records(a: np.ndarray, b: np.ndarray) -> None:
    """Field by field (padding bytes are nobody's business)."""
    assert a.dtype == b.dtype and len(a) == len(b)
    for name in a.dtype.names:
        if a.dtype[name].names:
            same_records(a[name], b[name])
        else:
            assert np.array_equal(a[name], b[name]), name


OBS = st.sampled_from(["ok", "ok", "ok", "ok", "nan", "outside"])
REQUEST = st.tuples(st.integers(0, LANES - 1), st.sampled_from([OP_STEP] * 6 + [OP_START, OP_START, OP_END,
                                                                               OP_RELEASE, 9]),
                    st.booleans(), OBS, st.floats(-2, 2, width=32), st.integers(1, 4))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=st.lists(REQUEST, min_size=20, max_size=80), seed=st.integers(0, 2**16))
def test_native_and_python_lone_steps_agree(twins, script, seed):
    native, python = twins
    rng = np.random.default_rng(seed)
    for lane, op, flag, obs_kind, reward, together in script:
        obs = rng.normal(size=4).astype(np.float32) * 0.5
        if obs_kind == "nan":
            obs[1] = np.nan
        elif obs_kind == "outside":
            obs[0] = 9.0
        flags = (EVALUATE if flag else 0) if op == OP_START else (TERMINATED if flag else 0)
        lanes = sorted((lane + k) % LANES for k in range(together))
        for i in lanes:  # (several at once: natively one after the other, as that many turns in Python)
            native.request(i, op, obs, reward, flags)
        assert native.server.serve_once() == len(lanes)
        for i in lanes:
            python.request(i, op, obs, reward, flags)
            assert python.server.serve_once() == 1
        for name in ANSWER:
            assert np.array_equal(native.area.lanes[name], python.area.lanes[name]), name
        for name in BOOK:
            assert np.array_equal(getattr(native.server.lanes["default"].book, name),
                                  getattr(python.server.lanes["default"].book, name)), name
        books = native.server.lanes["default"].book, python.server.lanes["default"].book
        same_records(books[0].pending, books[1].pending)
        same_records(native.link.all, python.link.all)  # (in one write or several: the same records)
        assert native.link.steps == python.link.steps and native.link.samples == python.link.samples
        assert native.policy.eval_ends == python.policy.eval_ends
        slots = native.server.lanes["default"].book.slots, python.server.lanes["default"].book.slots
        assert (slots[0].free, slots[0].next) == (slots[1].free, slots[1].next)
    assert native.server.stats == python.server.stats  # (requests, actions, batches, errors, histogram)
    assert python.natively == 0


def test_the_native_path_takes_the_common_case(twins):
    native, python = twins
    for t in (native, python):
        t.request(0, OP_START, np.zeros(4, np.float32), 0.0, 0)
        t.server.serve_once()
        for k in range(20):
            t.request(0, OP_STEP, np.full(4, 0.01 * k, np.float32), 1.0, 0)
            t.server.serve_once()
    assert native.natively == 21  # (the START too)
    same_records(native.link.all, python.link.all)
    assert len(native.link.all) >= 20 and native.server.stats.requests == python.server.stats.requests == 21


def test_a_turn_of_many_lone_requests_is_served_natively_when_the_net_is_small(tmp_path):
    """(64 clients' steps plus the START of those whose episode ended: more than 64 lanes
    in one turn; a small net's batch-1 passes are cheaper one by one than the batch path.)"""
    d, board = make_board(tmp_path)
    t = Twin(tmp_path, "many", d, board, native=True, sample_steps=10**6, lanes=200)
    t.policy.runner.refresh()
    t.policy.runner.batch1_s = 3e-6  # (a CartPole MLP's measured pass; a timing on a busy host varies)
    assert native_limit(t.policy.runner.batch1_s) >= 200 > native_limit(1e-3)
    for lane in range(200):
        t.request(lane, OP_START, np.zeros(4, np.float32), 0.0, 0)
    t.server.serve_once()
    assert t.natively == 200 and t.server.stats.requests == 200
    t.close()


def test_native_limit_follows_the_batch1_cost():
    assert native_limit(0.0) == native_limit(1e-9) == NATIVE_MAX_REQUESTS
    assert native_limit(1.0) == NATIVE_MIN_REQUESTS
    assert 99 <= native_limit(NATIVE_BUDGET_S / 100) <= 100  # (a float division, truncated)


def test_evaluation_episodes_are_served_natively_start_to_end(twins):
    for t in twins:
        t.request(0, OP_START, np.zeros(4, np.float32), 0.0, EVALUATE)
        t.server.serve_once()
        for k in range(5):
            t.request(0, OP_STEP, np.full(4, 0.01 * k, np.float32), 1.0, 0)
            t.server.serve_once()
        t.request(0, OP_END, np.zeros(4, np.float32), 2.0, TERMINATED)
        t.server.serve_once()
    native, python = twins
    assert native.natively == 7 and native.policy.eval_ends == python.policy.eval_ends
    assert [(e.episode_return, e.episode_length) for e in native.policy.eval_ends] == [(7.0, 6)]
    assert native.server.stats.actions == python.server.stats.actions == 6
    assert native.server.stats.requests == python.server.stats.requests == 7
    assert len(native.link.all) == len(python.link.all) == 0 and not native.server.lanes["default"].book.open[0]


def test_training_episodes_are_served_natively_start_to_end(twins):
    for t in twins:
        for episode in range(2):
            t.request(0, OP_START, np.zeros(4, np.float32), 0.0, 0)
            t.server.serve_once()
            for k in range(3):
                t.request(0, OP_STEP, np.full(4, 0.01 * k, np.float32), 1.0, 0)
                t.server.serve_once()
            t.request(0, OP_END, np.full(4, 0.2, np.float32), 2.0, TERMINATED if episode else TRUNCATED)
            t.server.serve_once()
    native, python = twins
    assert native.natively == 10 and python.natively == 0
    same_records(native.link.all, python.link.all)
    last = native.link.all[-1]  # (the second episode's END: its final record)
    assert last["flags"] == FINAL_OBS | REC_TERMINATED and last["weights_seq_no"] == -1
    assert native.server.stats == python.server.stats and native.link.steps == python.link.steps
    book = native.server.lanes["default"].book
    assert not book.open[0] and book.slot[0] == -1 and book.slots.free == [0]


def test_an_end_and_a_start_in_one_turn_reuse_the_agent_slot(twins):
    """(A C client's deferred END and its next START arrive as lone requests in one turn,
    the START often on the lower lane: the END is served first, so the START takes the slot
    it gave back, as the batch path's LaneBook.apply does; slots stay as many as episodes.)"""
    for t in twins:
        t.request(1, OP_START, np.zeros(4, np.float32), 0.0, 0)
        t.server.serve_once()
        t.request(0, OP_START, np.zeros(4, np.float32), 0.0, 0)
        t.request(1, OP_END, np.full(4, 0.2, np.float32), 1.0, TERMINATED)
        t.server.serve_once()
    native, python = twins
    assert native.natively == 3
    for t in twins:
        book = t.server.lanes["default"].book
        assert book.open[0] and not book.open[1] and book.slot[0] == 0 and book.slots.next == 1
    same_records(native.link.all, python.link.all)


def test_no_stepper_for_other_spaces(tmp_path):
    from rlinkd.client_lib.protocol.policy_spec import PolicySpec
    from rlinkd.client_lib.protocol.spaces import Box, Discrete
    cfg = load_config(None, [])
    d = P.policy_defs(cfg)["default"]
    board = WeightsBoard.create(str(tmp_path / "board"), d.spec.n_params(), orjson.dumps(d.spec.to_json()))
    runner = PolicyRunner("default", d.spec, d.obs_space, d.act_space, board, "native", seed=0)
    assert LoneStepper.maybe(runner, LaneLayout(step_layout(d))) is not None
    box = PolicySpec(Box((4,)), Box((2,)), hidden_sizes=(8,))
    boxed = PolicyRunner("b", box, box.obs_space, box.act_space, board, "native", seed=0)
    from rlinkd.client_lib.protocol.spaces import record_fields
    from rlinkd.shm.records import StepLayout
    layout = LaneLayout(StepLayout(record_fields(box.obs_space), box.act_space.action_size, box.dist_size))
    assert LoneStepper.maybe(boxed, layout) is None
    ints = PolicySpec(Box((4,), "int16", -5, 5), Discrete(3), hidden_sizes=(8,))
    inted = PolicyRunner("i", ints, ints.obs_space, ints.act_space, board, "native", seed=0)
    layout = LaneLayout(StepLayout(record_fields(ints.obs_space), 1, ints.dist_size))
    assert LoneStepper.maybe(inted, layout) is None


def test_a_hold_in_the_middle_of_a_turn_defers_the_rest(tmp_path):
    """On-policy: the request that completes the sample holds the policy; the turn's later
    requests wait for the next weights, as they would in later turns (none is answered with
    the old weights after the cut)."""
    d, board = make_board(tmp_path)
    t = Twin(tmp_path, "a", d, board, True, on_policy=True, sample_steps=2)
    for lane in range(3):
        t.request(lane, OP_START, np.zeros(4, np.float32), 0.0, 0)
    assert t.server.serve_once() == 3
    for lane in range(3):  # three STEPs in one turn: the second completes the sample
        t.request(lane, OP_STEP, np.full(4, 0.1, np.float32), 1.0, 0)
    assert t.server.serve_once() == 2
    assert t.link.held and t.link.samples == 1 and t.natively == 3 + 2
    assert t.area.answered(0) and t.area.answered(1) and not t.area.answered(2)
    assert t.server.serve_once() == 0 and not t.area.answered(2)  # (still held)
    board.publish(4, board.read()[1] * 0.5)
    t.link.held = False
    assert t.server.serve_once() == 1 and t.area.answered(2)
    assert t.area.lanes["weights_seq_no"][2] == 4 and t.area.lanes["weights_seq_no"][1] == 3
    t.close()


def test_a_hold_in_the_middle_of_a_turn_defers_its_groups_too(tmp_path):
    """(A lone request completes the sample: a group published in the same turn waits for
    the next weights as well; it is not served after the cut with the old ones.)"""
    d, board = make_board(tmp_path)
    t = Twin(tmp_path, "a", d, board, True, on_policy=True, sample_steps=2)
    for lane in range(4):
        t.request(lane, OP_START, np.zeros(4, np.float32), 0.0, 0)
    assert t.server.serve_once() == 4
    for lane in range(4):
        lanes = t.area.lanes
        lanes["obs"]["obs"][lane], lanes["op"][lane], lanes["reward"][lane] = 0.1, OP_STEP, 1.0
    t.area.publish(0)
    t.area.publish(1)  # (the second lone STEP completes the sample)
    t.area.publish_group(np.array([2, 3]), 7)
    assert t.server.serve_once() == 2 and t.link.held
    assert not t.area.answered(2) and not t.area.answered(3)
    board.publish(4, board.read()[1] * 0.5)
    t.link.held = False
    assert t.server.serve_once() == 2 and t.area.answered_all(np.array([2, 3]))
    assert list(t.area.lanes["weights_seq_no"][[2, 3]]) == [4, 4]
    t.close()


def test_random_cannot_rebind_or_rerun_during_a_step(twins):
    native, _ = twins
    runner, lone = native.policy.runner, native.policy.lone
    native.request(0, OP_START, np.zeros(4, np.float32), 0.0, 0)
    native.server.serve_once()
    native.request(0, OP_STEP, np.zeros(4, np.float32), 1.0, 0)
    program = runner.native_small.program

    def meddling():
        program.run(64, (np.zeros((64, 4), np.float32),), np.zeros((64, 2), np.float32))
        return 0.5
    lanes = native.server.lanes["default"].region.lanes
    order = np.zeros(1, np.int64)
    with pytest.raises(RuntimeError, match="in use"):
        lone.native.serve(program, lanes, order, 0, meddling, 3, lone.records, 64)

    class Sneaky:  # (what random() returns runs Python too: its float(), its release)
        def __float__(self):
            return meddling()
    with pytest.raises(RuntimeError, match="in use"):
        lone.native.serve(program, lanes, order, 0, Sneaky, 3, lone.records, 64)
    assert not native.area.answered(0)  # (nothing answered: the step raised before the answer)
    assert lone.native.serve(program, lanes, order, 0, lambda: 0.5, 3, lone.records, 64)[:4] == (1, 1, 1, False)


def test_serve_stops_at_a_declined_lane_and_at_max_steps(twins):
    native, _ = twins
    runner, lone, book = native.policy.runner, native.policy.lone, native.server.lanes["default"].book
    for lane in range(4):
        native.request(lane, OP_START, np.zeros(4, np.float32), 0.0, 0)
    assert native.server.serve_once() == 4
    lanes, program = native.server.lanes["default"].region.lanes, runner.native_small.program
    for lane in range(4):  # (lane 2 outside its bounds: declined)
        native.request(lane, OP_STEP, np.array([9.0 if lane == 2 else 0.1, 0, 0, 0], np.float32), 1.0, 0)
    order = np.arange(4, dtype=np.int64)
    assert lone.serve(lanes, order, 0, book, runner, 64) == (2, 2, 2, True, None)  # (each STEP completes a record)
    assert native.area.answered(1) and not native.area.answered(2)
    assert lone.serve(lanes, np.array([3, 0], np.int64), 0, book, runner, 1) == (1, 1, 1, False, None)  # (max_steps)
    assert native.area.answered(3) and native.area.answered(0) and not native.area.answered(2)
    assert lone.serve(lanes, order, 4, book, runner, 1) == (4, 0, 0, False, None)  # (nothing left)
    assert np.array_equal(lone.records["stream_id"][:1], book.slot[3:4].astype(np.uint32))
    with pytest.raises(ValueError, match="int64"):
        lone.native.serve(program, lanes, order.astype(np.int32), 0, lambda: 0.5, 3, lone.records, 1)
    with pytest.raises(ValueError, match="start"):
        lone.native.serve(program, lanes, order, 5, lambda: 0.5, 3, lone.records, 1)
    with pytest.raises(ValueError, match="max_steps"):
        lone.native.serve(program, lanes, order, 0, lambda: 0.5, 3, lone.records, 0)
    with pytest.raises(IndexError, match="lane 99"):
        lone.native.serve(program, lanes, np.array([99], np.int64), 0, lambda: 0.5, 3, lone.records, 1)


def test_a_recurrent_program_is_refused_by_the_lone_step(twins):
    """The lone step runs a Program's forward with no state to feed or keep: handed a
    recurrent step's program (same obs and dist widths) it refuses, answering nothing."""
    from rlinkd.client_lib.protocol.policy_spec import PolicySpec
    from rlinkd.client_lib.protocol.spaces import Box, Discrete
    native, _ = twins
    lone = native.policy.lone
    spec = PolicySpec(Box((4,)), Discrete(2), recurrent="gru", recurrent_size=8)
    program = netnative.NativeStep(spec, spec.init_flat(np.random.default_rng(0))).program
    native.request(0, OP_START, np.zeros(4, np.float32), 0.0, 0)
    lanes = native.server.lanes["default"].region.lanes
    with pytest.raises(ValueError, match="widths are not this layout's"):
        lone.native.serve(program, lanes, np.zeros(1, np.int64), 0, lambda: 0.5, 3, lone.records, 64)
    assert not native.area.answered(0)
