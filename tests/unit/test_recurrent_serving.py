"""Tier 1: server-side actions with a recurrent policy. The inference role keeps a state per
lane (zeros at START, the network's state out after each answered step), feeds it to its
step (on the backend forced or timed fastest; never the native lone step, which keeps no
state), and the step records it writes carry the states on
the fragment grid, also for fragments a sample boundary cut mid-episode. A role restart
loses the lanes' episodes and their states: their next STEP is answered STATUS_LOST."""
from __future__ import annotations

import functools
import os

import numpy as np
import orjson
import pytest

from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.netops import DIST, STATE_OUT
from rlinkd.daemon import policies as P
from rlinkd.daemon.config import load_config
from rlinkd.daemon.inference import backend as B
from rlinkd.daemon.inference.backend import STEP_MAKERS, PolicyRunner
from rlinkd.daemon.inference.episodes import SlotPool
from rlinkd.daemon.inference.lonestep import LoneStepper
from rlinkd.daemon.inference.policy_lanes import ServedArea
from rlinkd.daemon.inference.policy_serving import PolicyServing
from rlinkd.daemon.inference.server import InferenceServer
from rlinkd.daemon.wiring import step_layout
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.lanes import OP_END, OP_START, OP_STEP, STATUS_LOST, STATUS_OK, TERMINATED, LaneArea, LaneLayout
from rlinkd.shm.records import FINAL_OBS, HAS_STATE
from tests.unit.test_inference_server import FakeLink
from tests.unit.test_inference_server import request as publish

L = 3
OBS = np.array([0.01, 0.02, 0.03, 0.04], np.float32)


def recurrent_def(cell: str):
    cfg = load_config(None, [("ppo", "recurrent", cell), ("ppo", "recurrent_size", 4),
                             ("ppo", "max_seq_len", L)])
    return P.policy_defs(cfg)["default"]


@pytest.fixture(params=["lstm", "gru"])
def served(request, tmp_path):
    d = recurrent_def(request.param)
    board = WeightsBoard.create(str(tmp_path / "board"), d.spec.n_params(), orjson.dumps(d.spec.to_json()))
    flat = np.random.default_rng(0).normal(size=d.spec.n_params()).astype(np.float32) * 0.5
    board.publish(5, flat)
    layout = step_layout(d)
    runner = PolicyRunner("default", d.spec, d.obs_space, d.act_space, board, "native", seed=0)
    link = FakeLink(layout)
    policy = PolicyServing(runner, d.obs_space, SlotPool(), link, sample_steps=4)
    server = InferenceServer({"default": policy}, max_batch=64, max_wait_s=0.0, on_policy=False)
    path = str(tmp_path / "lanes")
    area = LaneArea.create(path, LaneLayout(layout), 4)
    server.add(ServedArea(0, area, "default", Doorbell.create()), fd := os.open(path, os.O_RDWR))
    os.close(fd)
    yield server, area, link, NumpyNet(d.spec, flat), policy
    server.close()


def obs(lane: int, i: int) -> np.ndarray:
    return OBS * (1 + lane) + 0.01 * i


def run_episodes(server, area, lengths: dict[int, int]) -> None:
    """Lanes step in lockstep (batched turns while two are open, lone turns after)."""
    for i in range(max(lengths.values()) + 1):
        for lane, n in lengths.items():
            if i == 0:
                publish(area, lane, OP_START, obs(lane, 0))
            elif i < n:
                publish(area, lane, OP_STEP, obs(lane, i), reward=1.0)
            elif i == n:
                publish(area, lane, OP_END, obs(lane, i), reward=1.0, flags=TERMINATED)
        server.serve_once()
        assert all(area.lanes["status"][lane] == STATUS_OK for lane in lengths), (i, area.lanes["status"])


def expected_states(net: NumpyNet, lane: int, steps: int) -> np.ndarray:
    """The states before each step of an episode, from zeros (hand-run)."""
    state, out = np.zeros((1, net.state_width), np.float32), []
    for i in range(steps):
        out.append(state[0])
        state = net.run({"": obs(lane, i)[None]}, state)[STATE_OUT]
    return np.stack(out)


def fragments(rec: np.ndarray, stream: int) -> list[np.ndarray]:
    """One stream's step records, split into fragments (FINAL_OBS ends one)."""
    mine = rec[rec["stream_id"] == stream]
    ends = np.flatnonzero(mine["flags"] & FINAL_OBS)
    return [mine[a:b] for a, b in zip(np.concatenate(([0], ends[:-1] + 1)), ends)]


def test_served_episodes_carry_the_lane_states_on_the_grid_across_cuts(served):
    server, area, link, net, policy = served
    run_episodes(server, area, {0: 8, 1: 5})
    assert policy.lone is None
    assert policy.runner.backends == (("native", "native") if B.netnative.available() else ("numpy", "numpy"))
    rec = link.all
    for lane, steps in ((0, 8), (1, 5)):
        want = expected_states(net, lane, steps)
        stream = int(rec["stream_id"][np.flatnonzero(np.isclose(rec["obs"]["obs"][:, 0], obs(lane, 0)[0]))[0]])
        position = 0
        frags = fragments(rec, stream)
        assert sum(len(f) for f in frags) == steps
        for frag in frags:                   # (sample_steps=4: cut mid-episode more than once)
            flagged = np.flatnonzero(frag["flags"] & HAS_STATE)
            assert flagged.tolist() == list(range(0, len(frag), L))
            np.testing.assert_allclose(frag["state"][flagged], want[position + flagged], atol=1e-6)
            assert not frag["state"][np.setdiff1d(np.arange(len(frag)), flagged)].any()
            position += len(frag)
    assert len(fragments(rec, stream)) > 1


def test_a_new_episode_on_a_lane_starts_from_zeros(served):
    server, area, link, net, _ = served
    run_episodes(server, area, {2: 2})
    first = len(link.all)
    run_episodes(server, area, {2: 4})
    again = link.all[first:]
    steps = again[(again["flags"] & FINAL_OBS) == 0]           # the episode's 4 steps in order
    flagged = np.flatnonzero(steps["flags"] & HAS_STATE)
    assert flagged[0] == 0 and not steps["state"][0].any()
    np.testing.assert_allclose(steps["state"][flagged], expected_states(net, 2, 4)[flagged], atol=1e-6)


def test_a_role_restart_loses_the_episodes_in_progress(served, tmp_path):
    server, area, _, _, policy = served
    publish(area, 0, OP_START, obs(0, 0))
    server.serve_once()
    restarted = InferenceServer({"default": policy}, max_batch=64, max_wait_s=0.0, on_policy=False)
    path = str(tmp_path / "lanes")
    restarted.add(ServedArea(0, area, "default", Doorbell.create()), fd := os.open(path, os.O_RDWR))
    os.close(fd)
    publish(area, 0, OP_STEP, obs(0, 1), reward=1.0)
    restarted.serve_once()
    assert area.lanes["status"][0] == STATUS_LOST
    publish(area, 0, OP_START, obs(0, 0))          # what the client does next: a new episode
    restarted.serve_once()
    lanes = restarted.lanes["default"]
    assert area.lanes["status"][0] == STATUS_OK and lanes.book.state[lanes.book.open].any()


def test_the_native_step_is_never_used_for_a_recurrent_policy():
    d = recurrent_def("gru")
    assert LoneStepper.maybe(PolicyRunner("p", d.spec, d.obs_space, d.act_space, None, "native"),
                             LaneLayout(step_layout(d))) is None


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_every_recurrent_backend_agrees_with_numpy(cell):
    d = recurrent_def(cell)
    flat = np.random.default_rng(1).normal(size=d.spec.n_params()).astype(np.float32) * 0.5
    obs_rows = {"": np.stack([obs(0, i) for i in range(3)])}
    state = np.random.default_rng(2).normal(size=(3, d.spec.state_size)).astype(np.float32)
    want = STEP_MAKERS["numpy"](d.spec, flat)(obs_rows, state)
    for name in ("onnxruntime", "torch", *(["native"] if B.netnative.available() else [])):
        for got, ref in zip(STEP_MAKERS[name](d.spec, flat)(obs_rows, state), want):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=name)


def test_records_after_the_link_reconnects_start_on_the_state_grid(served):
    """A collector restart gives the role a new link, which numbers every stream's fragments
    from 0 and has none of the old link's records: the first record of each open lane after
    the reconnect begins a fragment, carrying HAS_STATE (the collector refuses, and drops the
    link, otherwise)."""
    from rlinkd.daemon.collector.shm_clients import check_state_grid
    server, area, link, _, policy = served
    policy.sample_steps = 1000  # (no sample boundary cuts the fragment here)
    publish(area, 0, OP_START, obs(0, 0))
    server.serve_once()
    for i in range(1, 5):  # the fragment is 4 steps in: not on the grid of L = 3
        publish(area, 0, OP_STEP, obs(0, i), reward=1.0)
        server.serve_once()
    link.connected = False  # the collector restarts: what is served meanwhile is not sent
    publish(area, 0, OP_STEP, obs(0, 5), reward=1.0)
    server.serve_once()
    link.connected, link.records = True, []
    server.link_connected("default")
    for i in range(6, 8):
        publish(area, 0, OP_STEP, obs(0, i), reward=1.0)
        server.serve_once()
    rec = link.all
    assert len(rec) == 2 and rec["flags"][0] & HAS_STATE
    check_state_grid(rec["flags"], rec["stream_id"].astype(np.int64), np.zeros(64, np.int64), L)


def test_the_role_starts_new_fragments_when_a_link_connects():
    from types import SimpleNamespace

    from rlinkd.daemon.inference.process import Inference
    inf = object.__new__(Inference)
    told = []
    link = SimpleNamespace(connected=False, connect=lambda: None)
    inf.server = SimpleNamespace(policies={"p": SimpleNamespace(link=link)}, link_connected=told.append)
    inf.next_connect, inf.backoff = {"p": 0.0}, {"p": 0.1}
    inf._connect_links()
    assert told == ["p"]


class Named:
    """A candidate's timed step, named for a fake timer."""

    def __init__(self, make, name: str, spec, flat) -> None:
        self.forward, self.name = make(spec, flat), name

    def __call__(self, obs):
        return self.forward(obs)


@pytest.mark.skipif(not B.netnative.available(), reason="the _native extension is not built")
@pytest.mark.parametrize("fastest, backends", [
    ({"native@1", "native@64"}, ("native", "native")),
    ({"numpy@1", "numpy@64"}, ("numpy", "numpy")),
    ({"native@1", "numpy@64"}, ("native", "numpy")),
])
def test_a_recurrent_policy_keeps_the_step_timed_fastest_per_batch_size(tmp_path, monkeypatch, fastest,
                                                                         backends):
    """As for a feed-forward policy: every candidate step is timed at batches of 1 and 64
    (here with injected timings) and each batch size keeps its fastest; the steps the
    runner then uses are those backends' and answer as numpy does."""
    d = recurrent_def("lstm")
    board = WeightsBoard.create(str(tmp_path / "board"), d.spec.n_params(), orjson.dumps(d.spec.to_json()))
    flat = np.random.default_rng(3).normal(size=d.spec.n_params()).astype(np.float32) * 0.5
    board.publish(1, flat)
    timed: list[str] = []

    def fake_time(forward: Named, obs) -> float:
        forward(obs)  # (the candidate really runs, with a state of the batch's rows)
        key = f"{forward.name}@{len(next(iter(obs.values())))}"
        timed.append(key)
        return 1e-6 if key in fastest else 1e-3
    monkeypatch.setattr(B, "cuda_present", lambda: False)
    monkeypatch.setattr(B, "time_backend", fake_time)
    monkeypatch.setattr(B, "STEP_TIMED", {name: functools.partial(Named, make, name)
                                          for name, make in B.STEP_TIMED.items()})
    runner = PolicyRunner("p", d.spec, d.obs_space, d.act_space, board, "auto", seed=0)
    assert runner.refresh() and runner.backends == backends
    assert set(timed) == {f"{n}@{rows}" for n in ("native", "numpy", "onnxruntime") for rows in (1, 64)}
    assert runner.backend == (backends[0] if backends[0] == backends[1] else "/".join(backends))
    kinds = [type(getattr(step, "__self__", None)) is B.netnative.NativeStep for step in runner.steps]
    assert kinds == [name == "native" for name in backends]
    for rows in (1, 20):  # (a small batch and a large one: each on its own step)
        state = np.random.default_rng(rows).normal(size=(rows, d.spec.state_size)).astype(np.float32)
        lanes = np.zeros(rows, LaneLayout(step_layout(d)).dtype)
        lanes["obs"]["obs"] = np.stack([obs(0, i) for i in range(rows)])
        *_, dist, state_out = runner.act_with_state(lanes["obs"], np.zeros(rows, bool), state)
        want = NumpyNet(d.spec, flat).run({"": lanes["obs"]["obs"]}, state)
        np.testing.assert_allclose(state_out, want[STATE_OUT], atol=1e-5)
        np.testing.assert_allclose(dist, want[DIST], atol=1e-5)
