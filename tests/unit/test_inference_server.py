"""The inference role's core: lane bookkeeping (vectorised and scalar paths agree), step records
a served episode becomes, sample cuts and on-policy holds, evaluation lanes, weight versions."""
from __future__ import annotations

import functools

import os
import tempfile
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinkd.daemon import policies as P
from rlinkd.daemon.config import load_config
from rlinkd.daemon.inference.backend import PolicyRunner, choose_backend
from rlinkd.daemon.inference.episodes import LaneBook, Requests, SlotPool, concat
from rlinkd.daemon.inference.netnative import native_module
from rlinkd.daemon.inference.policy_lanes import ServedArea
from rlinkd.daemon.inference.policy_serving import PolicyServing
from rlinkd.daemon.inference.server import InferenceServer
from rlinkd.daemon.wiring import step_layout
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.lanes import (EVALUATE, OP_END, OP_RELEASE, OP_START, OP_STEP, STATUS_BAD_OBS,
                              STATUS_BAD_OP, STATUS_LOST, STATUS_OK, TERMINATED, LaneArea, LaneLayout)
from rlinkd.shm.records import FINAL_OBS, HAS_LOGP, TERMINATED as REC_TERMINATED, TRUNCATED as REC_TRUNCATED

needs_native = pytest.mark.skipif(native_module() is None, reason="the _native extension is not built "
                                  "(test_the_extension_is_built_where_there_is_a_compiler fails where cc exists)")
OBS = np.array([0.01, 0.02, 0.03, 0.04], np.float32)


class FakeLink:
    """Stands in for PolicyLink: keeps what the server hands on."""

    def __init__(self, layout) -> None:
        self.layout, self.records, self.steps, self.samples = layout, [], 0, 0
        self.held, self.connected = False, True

    def write(self, records, train_steps):
        self.records.append(records.copy())
        self.steps += train_steps

    @property
    def all(self):
        return concat(self.records, self.layout)

    def sample_ready(self, on_policy):
        self.samples += 1
        self.steps = 0
        self.held = on_policy


@pytest.fixture
def setup(tmp_path):
    made = make_server(tmp_path)
    yield made
    made[0].close()


def make_server(tmp_path):
    d = P.policy_defs(load_config(None, []))["default"]
    board = WeightsBoard.create(str(tmp_path / "board"), d.spec.n_params(), orjson.dumps(d.spec.to_json()))
    rng = np.random.default_rng(0)
    board.publish(5, rng.normal(size=d.spec.n_params()).astype(np.float32) * 0.1)
    layout = step_layout(d)
    runner = PolicyRunner("default", d.spec, d.obs_space, d.act_space, board, "numpy", seed=0)
    link = FakeLink(layout)
    policy = PolicyServing(runner, d.obs_space, SlotPool(), link, sample_steps=6)
    server = InferenceServer({"default": policy}, max_batch=64, max_wait_s=0.0, on_policy=True)
    areas = []
    for i in range(2):
        path = str(tmp_path / f"lanes{i}")
        area = LaneArea.create(path, LaneLayout(layout), 4)
        server.add(ServedArea(i, area, "default", Doorbell.create()), fd := os.open(path, os.O_RDWR))
        os.close(fd)
        areas.append(area)
    return server, areas, link, board, d


def request(area, lane, op, obs=OBS, reward=0.0, flags=0):
    area.lanes["obs"]["obs"][lane] = obs
    area.lanes["op"][lane], area.lanes["flags"][lane], area.lanes["reward"][lane] = op, flags, reward
    area.publish(lane)


def test_an_episode_becomes_step_records_like_a_client_side_one(setup):
    server, (area, _), link, _, _ = setup
    request(area, 0, OP_START)
    assert server.serve_once() == 1 and area.answered(0)
    assert area.lanes["status"][0] == STATUS_OK and area.lanes["weights_seq_no"][0] == 5
    first_action = float(area.lanes["action"][0][0])
    request(area, 0, OP_STEP, OBS + 0.01, reward=1.0)
    server.serve_once()
    request(area, 0, OP_END, OBS + 0.02, reward=2.0, flags=TERMINATED)
    server.serve_once()
    rec = link.all
    assert list(rec["reward"][:2]) == [1.0, 2.0] and link.steps == 2
    assert float(rec["action"][0][0]) == first_action
    assert np.allclose(rec["obs"]["obs"][0], OBS) and np.allclose(rec["obs"]["obs"][2], OBS + 0.02)
    assert all(rec["flags"][:2] & HAS_LOGP) and rec["flags"][2] == FINAL_OBS | REC_TERMINATED
    assert len(set(rec["stream_id"])) == 1 and list(rec["weights_seq_no"][:2]) == [5, 5]


def test_errors_per_request_leave_the_others_alone(setup):
    server, (a, b), _, _, _ = setup
    request(a, 0, OP_STEP, reward=1.0)               # no episode open here: lost
    request(a, 1, 9)                                 # no such op
    request(a, 2, OP_START, np.array([np.nan, 0, 0, 0], np.float32))
    request(b, 0, OP_START)
    assert server.serve_once() == 4
    assert [int(s) for s in a.lanes["status"][:3]] == [STATUS_LOST, STATUS_BAD_OP, STATUS_BAD_OBS]
    assert b.lanes["status"][0] == STATUS_OK and server.stats.errors == 3


def test_scalar_and_vectorised_bookkeeping_agree(setup):
    _, (area, _), _, _, d = setup
    layout = step_layout(d)
    books = [LaneBook(4, layout, SlotPool()) for _ in range(2)]
    script = [(OP_START, 0, 0.0), (OP_STEP, 0, 1.0), (OP_STEP, 0, 0.5), (OP_END, TERMINATED, 2.0),
              (OP_START, EVALUATE, 0.0), (OP_STEP, 0, 3.0), (OP_END, 0, 1.0), (OP_START, 0, 0.0),
              (OP_RELEASE, 0, 0.0)]
    outs: list[list] = [[], []]
    for i, (op, flags, reward) in enumerate(script):
        request(area, 1, op, OBS + 0.01 * i, reward, flags)
        req = Requests.read(area.lanes, np.array([1]))
        scalar = books[0].apply_one(1, op, flags, reward, req.obs[0], False, outs[0])
        vector = books[1].apply(req, np.zeros(1, bool))
        outs[1].append(vector.records)
        assert (scalar[0], scalar[1], scalar[2]) == (vector.status[0], vector.wants_action[0], vector.explore[0])
        assert (scalar[3] is None) == (not vector.eval_ends)
        if scalar[1]:
            act = np.array([float(i % 2)], np.float32)
            books[0].remember_one(1, req.obs[0], act, -0.5, np.zeros(2, np.float32), 3)
            books[1].remember(req, np.array([True]), act[None], np.array([-0.5], np.float32),
                              np.zeros((1, 2), np.float32), 3)
        area.answer(np.array([1]), req.seqs)
    a, b = (np.concatenate([x for x in o if len(x)]) for o in outs)
    assert a.tobytes() == b.tobytes() and len(a) == 4  # 3 steps + FINAL_OBS; evaluation and
    assert a["flags"][-1] == FINAL_OBS | REC_TERMINATED  # the released start record nothing


def test_evaluation_lanes_record_nothing_and_report_their_return(setup):
    server, (area, _), link, _, _ = setup
    request(area, 0, OP_START, flags=EVALUATE)
    server.serve_once()
    request(area, 0, OP_STEP, reward=1.5)
    server.serve_once()
    request(area, 0, OP_END, reward=2.0, flags=TERMINATED)
    server.serve_once()
    assert len(link.all) == 0 and link.steps == 0
    ends = server.policies["default"].eval_ends
    assert [(e.episode_return, e.episode_length) for e in ends] == [(3.5, 2)]


def test_a_sample_cut_holds_training_lanes_until_weights_arrive(setup):
    server, (a, b), link, board, _ = setup
    request(a, 0, OP_START)
    request(b, 0, OP_START, flags=EVALUATE)
    server.serve_once()
    for i in range(6):
        request(a, 0, OP_STEP, OBS + 0.01 * i, reward=1.0)
        server.serve_once()
    assert link.samples == 1 and link.held
    cut = link.all[-1:]
    assert cut["flags"][0] == FINAL_OBS  # the fragment ends mid-episode, no done flag
    request(a, 0, OP_STEP, reward=1.0)
    request(b, 0, OP_STEP, reward=1.0)
    server.serve_once()
    assert not a.answered(0) and b.answered(0)  # held: only the evaluation lane is served
    board.publish(6, board.read()[1] * 0.5)
    link.held = False  # WEIGHTS_READY
    server.serve_once()
    assert a.answered(0) and a.lanes["weights_seq_no"][0] == 6


def test_a_batch_never_mixes_versions(setup):
    server, (a, b), _, board, _ = setup
    for lane in range(4):
        request(a, lane, OP_START)
        request(b, lane, OP_START)
    board.publish(9, board.read()[1] * 0.5)
    server.serve_once()
    assert set(a.lanes["weights_seq_no"]) | set(b.lanes["weights_seq_no"]) == {9}
    assert server.stats.batches == 1 and server.stats.histogram[3] == 1  # one batch of 8


def test_a_client_gone_ends_its_fragments_truncated(setup):
    server, (area, _), link, _, _ = setup
    request(area, 0, OP_START)
    server.serve_once()
    request(area, 0, OP_STEP, reward=1.0)
    server.serve_once()
    server.remove(0)
    rec = link.all
    assert rec["flags"][-1] == FINAL_OBS | REC_TRUNCATED and 0 not in server.areas


def test_backends_agree_and_auto_chooses_by_timing(setup):
    _, _, _, board, d = setup
    from rlinkd.daemon.inference.backend import MAKERS
    _, flat = board.read()
    runner = PolicyRunner("default", d.spec, d.obs_space, d.act_space, board, "numpy")
    obs = {"": np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)}
    outs = {name: MAKERS[name](d.spec, flat)(obs) for name in ("native", "numpy", "onnxruntime", "torch")}
    for name in ("native", "onnxruntime", "torch"):
        assert np.allclose(outs["numpy"], outs[name], atol=1e-5), name
    (small, large), timings = choose_backend(d.spec, flat, "auto", runner._sample_obs)
    assert {small, large} <= {"native", "numpy", "onnxruntime"} and len(timings) == 6
    assert timings[f"{small}@1"] == min(v for k, v in timings.items() if k.endswith("@1"))


class Tagged:
    """A backend's forward, marked as running on the GPU or not (for a fake timer)."""

    def __init__(self, maker, gpu: bool, spec, flat) -> None:
        self.forward, self.gpu = maker(spec, flat), gpu

    def __call__(self, obs):
        return self.forward(obs)


@pytest.mark.parametrize("torch_at_64_s, large_expected", [(1.0, None), (1e-9, "torch")])
def test_a_gpu_host_times_the_cpu_backends_beside_torch(setup, monkeypatch, torch_at_64_s,
                                                        large_expected):
    """A host that looks like a GPU host: torch (on CUDA) is one more candidate; the CPU
    backends are still timed, and each batch size keeps its fastest."""
    from rlinkd.daemon.inference import backend
    _, _, _, board, d = setup
    _, flat = board.read()
    runner = PolicyRunner("default", d.spec, d.obs_space, d.act_space, board, "numpy")

    def fake_time(forward: Tagged, obs) -> float:
        rows = len(next(iter(obs.values())))
        return (torch_at_64_s if rows == 64 else 1.0) if forward.gpu else 1e-3
    monkeypatch.setattr(backend, "cuda_present", lambda: True)
    monkeypatch.setattr(backend, "time_backend", fake_time)
    monkeypatch.setattr(backend, "MAKERS", {name: functools.partial(Tagged, maker, name == "torch")
                                            for name, maker in backend.MAKERS.items()})
    assert backend.candidates(d.spec)[-1] == "torch" and len(backend.candidates(d.spec)) > 1
    (small, large), timings = choose_backend(d.spec, flat, "auto", runner._sample_obs)
    assert small != "torch" and {"numpy@1", "onnxruntime@1", "torch@1"} <= set(timings)
    assert large == (large_expected or small)


def test_training_requests_wait_for_the_link_to_the_collector(setup):
    """Steps served while the collector is unreachable would be lost: they wait instead."""
    server, (a, b), link, _, _ = setup
    link.connected = False
    request(a, 0, OP_START)
    request(b, 0, OP_START, flags=EVALUATE)
    server.serve_once()
    assert not a.answered(0) and b.answered(0)
    link.connected = True
    server.serve_once()
    assert a.answered(0) and a.lanes["status"][0] == STATUS_OK


def test_a_group_is_answered_in_one_pass_with_one_version(setup):
    server, (a, _), _, board, _ = setup
    for lane in range(3):
        a.lanes["group"][lane], a.lanes["group_size"][lane] = 5, 3
    request(a, 0, OP_START)
    request(a, 1, OP_START)
    assert server.fresh_arrivals() == 2
    server.serve_once()
    assert not a.answered(0) and not a.answered(1)  # 2 of 3: the group waits
    # (left pending: no longer fresh, so the idle role sleeps instead of spinning on them;
    # still arrivals, so it sleeps only BUSY_RETRY_S)
    assert server.fresh_arrivals() == 0 and server.arrivals() == 2
    board.publish(8, board.read()[1] * 0.5)
    request(a, 2, OP_START)
    assert server.fresh_arrivals() == 1  # (the idle role's last look before sleeping sees it)
    server.serve_once()
    assert all(a.answered(i) for i in range(3)) and set(a.lanes["weights_seq_no"][:3]) == {8}


def test_a_dqn_policy_is_served_epsilon_greedy_once_epsilon_is_known(setup):
    """The role applies the epsilon a WEIGHTS_READY brought (its policy's runner.epsilon):
    epsilon 0 is the argmax on every row, single or batched; None samples softmax."""
    server, _, _, _, d = setup
    runner = server.policies["default"].runner
    runner.refresh()
    rows = np.zeros(200, step_layout(d).dtype)["obs"]
    rows["obs"] = np.random.default_rng(2).normal(size=(200, 4))
    greedy, _, _ = runner.act(rows, np.zeros(200, bool))
    runner.epsilon = 0.0
    for n in (1, 200):
        actions, logp, _ = runner.act(rows[:n], np.ones(n, bool))
        assert np.array_equal(actions, greedy[:n]) and np.allclose(logp, 0.0)
    runner.epsilon = 1.0
    actions, _, _ = runner.act(rows, np.ones(200, bool))
    assert 0.3 < float((actions != greedy).mean()) < 0.7  # uniform over 2 actions: half differ


def test_a_link_queues_fewer_records_the_bigger_they_are():
    from rlinkd.daemon.inference.link import AT_ONCE_RECORDS, COALESCE_BYTES, MAX_COALESCE, coalesce_records
    assert coalesce_records(104) == MAX_COALESCE  # (CartPole's)
    assert coalesce_records(COALESCE_BYTES // 100) == 100
    assert coalesce_records(84 * 84 * 3 + 64) == AT_ONCE_RECORDS  # (an image's: at least a batch)


def test_the_link_coalesces_step_records_into_few_ring_writes(setup):
    """Small batches wait in the link's queue: one ring write per ``coalesce`` records,
    or once the first queued is COALESCE_S old (the idle role sleeps no longer than
    ``due_in_s``), or at flush (SAMPLE_READY, close); a batch of AT_ONCE_RECORDS goes at
    once, after what was queued."""
    from rlinkd.daemon.inference.link import AT_ONCE_RECORDS, COALESCE_S, PolicyLink, coalesce_records
    _, _, _, _, d = setup
    layout = step_layout(d)
    writes = []

    class Ring:
        def write_batch(self, records, timeout_s):
            writes.append(records["reward"].copy())

    link = PolicyLink("/nonexistent", "token", "default", layout)
    link.ring = Ring()
    assert link.due_in_s() is None  # nothing queued: the idle role may sleep its full time
    batch = layout.empty(10)
    batch["reward"] = np.arange(10)
    link.write(batch, 10)
    assert writes == [] and link.queued == 10 and link.steps == 10
    assert 0.0 < link.due_in_s() <= COALESCE_S  # the idle role wakes by then to write them
    link.flush(only_old=True)
    assert writes == []  # not due yet
    link.first_queued_at -= 1.0  # the first queued record is old: the next write sends all
    assert link.due_in_s() == 0.0
    link.write(batch[:3], 3)
    assert [len(w) for w in writes] == [13] and link.queued == 0
    full = link.coalesce
    assert full == coalesce_records(layout.record_bytes) > AT_ONCE_RECORDS
    for _ in range(full // 10 + 1):
        link.write(batch, 10)
    assert [len(w) for w in writes] == [13, full // 10 * 10]  # full: written
    link.flush()
    assert sum(len(w) for w in writes) == 13 + (full // 10 + 1) * 10 and link.queued == 0
    assert list(writes[-1]) == list(range(10)) * (len(writes[-1]) // 10)  # order kept
    big = layout.empty(AT_ONCE_RECORDS)
    big["reward"] = 100
    link.write(batch[:3], 3)
    link.write(big, AT_ONCE_RECORDS)  # (a vector client's group: at once, after the queued three)
    assert [len(w) for w in writes[-2:]] == [3, AT_ONCE_RECORDS] and link.queued == 0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_lone_request_with_a_non_finite_observation_is_refused(setup, bad):
    """The lone-request path checks one row in plain Python: NaN and +-inf still fail."""
    server, (a, _), _, _, _ = setup
    request(a, 0, OP_START, np.array([0.0, bad, 0.0, 0.0], np.float32))
    assert server.serve_once() == 1 and a.lanes["status"][0] == STATUS_BAD_OBS
    request(a, 1, OP_START)
    assert server.serve_once() == 1 and a.lanes["status"][1] == STATUS_OK


def test_a_new_client_in_a_removed_clients_range_starts_with_clean_lanes(setup, tmp_path):
    """The region reuses a departed client's lane range: none of its episodes (open, pending
    step, stream slot) may leak into the newcomer's lanes."""
    server, (a, _), link, _, d = setup
    request(a, 0, OP_START)
    server.serve_once()
    request(a, 0, OP_STEP, reward=1.0)
    server.serve_once()
    start = server.areas[0].where.start
    server.remove(0)  # a leaves mid-episode
    path = str(tmp_path / "newcomer")
    c = LaneArea.create(path, LaneLayout(step_layout(d)), 4)
    server.add(ServedArea(9, c, "default", Doorbell.create()), fd := os.open(path, os.O_RDWR))
    os.close(fd)
    assert server.areas[9].where.start == start
    request(c, 0, OP_STEP, reward=1.0)  # no episode is open in this lane for the newcomer
    assert server.serve_once() == 1 and c.lanes["status"][0] == STATUS_LOST
    n = len(link.all)
    request(c, 1, OP_START, OBS + 0.05)
    assert server.serve_once() == 1 and c.lanes["status"][1] == STATUS_OK and len(link.all) == n
    request(c, 1, OP_STEP, OBS + 0.06, reward=2.0)
    server.serve_once()
    rec = link.all[n:]
    assert len(rec) == 1 and rec["reward"][0] == 2.0 and np.allclose(rec["obs"]["obs"][0], OBS + 0.05)


def test_the_idle_role_wakes_for_a_lost_links_next_connection_attempt():
    """A policy whose link to the collector is down holds its training requests; the idle role
    must not sleep past the link's next attempt (IDLE_S would delay the reconnect by up to 100 ms)."""
    import math
    import time
    from types import SimpleNamespace

    from rlinkd.daemon.inference.process import Inference
    inf = object.__new__(Inference)
    up, down = SimpleNamespace(connected=True), SimpleNamespace(connected=False)
    inf.server = SimpleNamespace(policies={"a": SimpleNamespace(link=up), "b": SimpleNamespace(link=down),
                                           "frozen": SimpleNamespace(link=None)})
    now = time.monotonic()
    inf.next_connect = {"a": now - 5.0, "b": now + 0.03, "frozen": 0.0}
    assert 0.0 < inf._reconnect_due_s() <= 0.03
    down.connected = True
    assert inf._reconnect_due_s() == math.inf


def test_requests_published_while_a_batch_gathers_join_it(setup):
    """The role's direct connections publish only in its own loop: the gather wait calls
    ``while_gathering`` (their reads), so a request arriving then joins the batch."""
    server, (a, b), _, _, _ = setup
    request(a, 0, OP_START)
    request(b, 0, OP_START)
    assert server.serve_once() == 2  # two episodes open
    server.max_wait_s = 0.5
    server.policies["default"].runner.batch1_s = 0.01  # (a network worth waiting for)
    calls = []

    def arrive():
        if not calls:
            request(b, 0, OP_STEP)
        calls.append(1)
    server.while_gathering = arrive
    request(a, 0, OP_STEP)
    batches = server.stats.batches
    assert server.serve_once() == 2 and calls
    assert server.stats.batches == batches + 1  # one forward pass for both


def test_a_request_waits_for_others_no_longer_than_batching_saves(setup):
    """Two episodes open, one request in: it waits for the other at most GATHER_FORWARDS
    batch-1 forward passes (measured), not the whole max_wait (a cheap MLP is answered
    at once; two lockstep clients lost half their rate to a 200 us wait)."""
    import time
    server, (a, b), _, _, _ = setup
    request(a, 0, OP_START)
    request(b, 0, OP_START)
    assert server.serve_once() == 2
    runner = server.policies["default"].runner
    assert 0 < runner.batch1_s < 0.01  # (measured when the weights were loaded)
    server.max_wait_s, runner.batch1_s = 0.5, 0.002
    assert server.gather_limit_s() == 0.004
    request(a, 0, OP_STEP)
    t0 = time.perf_counter()
    assert server.serve_once() == 1
    assert 0.004 <= time.perf_counter() - t0 < 0.2  # (waited for b, then gave up)
    server.max_wait_s = 0.001
    assert server.gather_limit_s() == 0.001
    runner.batch1_s = 5e-6  # (a native MLP pass: no wait at all)
    request(a, 0, OP_STEP)
    calls = []
    server.while_gathering = lambda: calls.append(1)
    assert server.serve_once() == 1 and not calls


def test_the_extension_is_built_where_there_is_a_compiler():
    """(It is optional for an install without one; on a machine with cc, as in CI, a build
    failure must fail here, not skip every test of test_netnative.py.)"""
    import shutil
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    from rlinkd.daemon.inference import netnative
    assert netnative.available()


@pytest.mark.parametrize("scan", ["native", "numpy by area", "numpy every lane"])
def test_a_scan_of_the_moved_areas_finds_what_a_full_scan_does(setup, monkeypatch, scan):
    """(``pending(slots)``: only the moved areas' lanes -- natively, or in numpy area by area
    when few areas moved against the region's lanes and every lane otherwise (here: 1 << 30
    with two areas).)"""
    import rlinkd.daemon.inference.policy_lanes as lanes_mod
    monkeypatch.setattr(lanes_mod, "FULL_SCAN_LANES", 1 << 30 if scan == "numpy every lane" else 1)
    server, (a, b), _, _, _ = setup
    pl = server.lanes["default"]
    if scan == "native":
        assert pl.scan is not None, "the extension is built in CI"
    else:
        pl.scan = None
    pl.snapshot()
    request(b, 3, OP_START)
    request(a, 1, OP_START)
    moved = pl.snapshot()
    assert moved is not None and len(moved) == 2
    assert sorted(pl.pending(moved).tolist()) == sorted(pl.pending().tolist()) and len(pl.pending()) == 2
    request(a, 0, OP_START)  # (one area moved: only its lanes are looked at, whatever the rule)
    moved = pl.snapshot()
    assert moved is not None and len(moved) == 1
    assert len(pl.pending()) == 3 and sorted(pl.pending(moved).tolist()) == [0, 1]
    assert len(pl.pending(np.zeros(0, np.int64))) == 0


@needs_native
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_the_native_lane_scan_agrees_with_numpy(data):
    """(Areas come and go, lanes are requested and answered at random: the native scan
    returns exactly what the numpy one does, in the same order, for every area and for any
    set of moved header slots.)"""
    with tempfile.TemporaryDirectory() as tmp:
        server, areas, _, _, d = make_server(Path(tmp))
        try:
            _scan_script(server, areas, d, Path(tmp), data)
        finally:
            server.close()


def _scan_script(server, areas, d, tmp_path, data) -> None:
    pl = server.lanes["default"]
    assert pl.scan is not None
    live = dict(enumerate(areas))
    for step in range(data.draw(st.integers(1, 12))):
        action = data.draw(st.sampled_from(["request", "request", "answer", "add", "remove", "scribble"]))
        if action == "add" and len(live) < 6:
            area_id = max(live, default=1) + 1
            path = str(tmp_path / f"more{area_id}-{step}")
            live[area_id] = LaneArea.create(path, LaneLayout(step_layout(d)), data.draw(st.integers(1, 70)))
            server.add(ServedArea(area_id, live[area_id], "default", Doorbell.create()),
                       fd := os.open(path, os.O_RDWR))
            os.close(fd)
        elif action == "remove" and live:
            server.remove(area_id := data.draw(st.sampled_from(sorted(live))))
            del live[area_id]
        elif action == "request" and live:
            area = live[data.draw(st.sampled_from(sorted(live)))]
            request(area, data.draw(st.integers(0, area.capacity - 1)), OP_START)
        elif action == "scribble" and live:  # (a client writes past its own lanes, in its last page)
            where = pl.by_slot[data.draw(st.sampled_from(sorted(pl.by_slot)))].where
            if where.count > where.served:
                pl.region.lanes["req_seq"][where.start + data.draw(st.integers(where.served, where.count - 1))] += 1
        elif action == "answer":
            lanes = pl.region.lanes
            lanes["resp_seq"][:] = np.where(data.draw(st.booleans()), lanes["req_seq"], lanes["resp_seq"])
        slots = np.array(sorted(data.draw(st.sets(st.integers(0, len(pl.region.headers) - 1)))), np.int64)
        assert pl.pending().tolist() == pl._pending_numpy(None).tolist()
        assert pl.pending(slots).tolist() == _numpy_by_area(pl, slots)


def _numpy_by_area(pl, slots: np.ndarray) -> list[int]:
    import rlinkd.daemon.inference.policy_lanes as lanes_mod
    saved, lanes_mod.FULL_SCAN_LANES = lanes_mod.FULL_SCAN_LANES, 0
    try:
        return pl._pending_numpy(slots).tolist()
    finally:
        lanes_mod.FULL_SCAN_LANES = saved


@needs_native
def test_the_native_lane_scan_refuses_what_is_out_of_bounds():
    scan, lanes = native_module().pending_lanes, np.zeros(8, LaneLayout(step_layout(
        P.policy_defs(load_config(None, []))["default"])).dtype)
    at = (lanes.dtype.fields["req_seq"][1], lanes.dtype.fields["resp_seq"][1])
    starts, counts, out = np.array([0, 4]), np.array([4, 4]), np.zeros(8, np.int64)
    lanes["req_seq"][[1, 6]] = 1
    assert scan(lanes, *at, starts, counts, np.array([1, 0]), out) == 2 and out[:2].tolist() == [6, 1]
    for bad_starts, bad_counts, slots in (([0, 5], [4, 4], [1]), ([0, 4], [4, 4], [2]), ([0, -1], [4, 4], [1]),
                                          ([0, 4], [4, 9], [1])):
        with pytest.raises(ValueError):
            scan(lanes, *at, np.array(bad_starts), np.array(bad_counts), np.array(slots), out)
    with pytest.raises(ValueError):  # (no room for every lane looked at)
        scan(lanes, *at, starts, counts, np.array([0, 1]), np.zeros(7, np.int64))
    with pytest.raises(ValueError):  # (a seq word past the lane record)
        scan(lanes, lanes.dtype.itemsize - 2, at[1], starts, counts, np.array([0]), out)
    with pytest.raises(ValueError):
        scan(lanes, *at, starts.astype(np.int32), counts, np.array([0]), out)
    shared = np.array([0, 4, 4, 4, 1, 0, 0, 0, 0, 0])  # (out over starts, counts and slots)
    with pytest.raises(ValueError, match="share memory"):
        scan(lanes, *at, shared[0:2], shared[2:4], shared[4:5], shared[3:])


def test_an_area_announced_again_is_not_opened_twice():
    """A restarted role may read an "open" queued for its predecessor and then the same area's
    announcement at its hello: the second is dropped (its descriptors closed), the area kept."""
    import os
    from types import SimpleNamespace

    from rlinkd.daemon.inference.process import Inference
    from rlinkd.daemon.serving import channel
    inf = object.__new__(Inference)
    added = []
    inf.topo = SimpleNamespace(policies={"default": object()})
    inf.server = SimpleNamespace(areas={7: "served"}, add=lambda *a: added.append(a))
    fds = (os.eventfd(0), os.eventfd(0))
    inf._open_area(channel.ChannelMessage("open", 7, "default", "name", fds))
    assert added == [] and inf.server.areas == {7: "served"}
    for fd in fds:
        try:
            os.fstat(fd)
        except OSError:
            continue
        os.close(fd)
        raise AssertionError("a duplicate's descriptor was left open")
