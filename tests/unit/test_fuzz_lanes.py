"""Fuzzing the serving lanes: a shared-memory action client can write any byte of its own
lane area (every lane field, whole lanes past its own, request groups that never complete).
The inference role must answer what is valid, refuse what is not (a status in that lane),
never raise, and never let one client's scribbles reach another client's answers."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinkd.daemon import policies as P
from rlinkd.daemon.config import load_config
from rlinkd.daemon.inference.backend import PolicyRunner
from rlinkd.daemon.inference.episodes import SlotPool, concat
from rlinkd.daemon.inference.policy_lanes import ServedArea
from rlinkd.daemon.inference.policy_serving import PolicyServing
from rlinkd.daemon.inference.server import InferenceServer
from rlinkd.daemon.wiring import step_layout
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.lanes import OP_START, OP_STEP, STATUS_OK, LaneArea, LaneLayout

OBS = np.array([0.01, 0.02, 0.03, 0.04], np.float32)


class Link:
    def __init__(self, layout) -> None:
        self.layout, self.records, self.steps, self.held, self.connected = layout, [], 0, False, True

    def write(self, records, train_steps):
        self.records.append(records.copy())
        self.steps += train_steps

    def sample_ready(self, on_policy):
        self.steps = 0


def serving(tmp: str):
    d = P.policy_defs(load_config(None, []))["default"]
    board = WeightsBoard.create(f"{tmp}/board", d.spec.n_params(), orjson.dumps(d.spec.to_json()))
    board.publish(1, np.random.default_rng(0).normal(size=d.spec.n_params()).astype(np.float32) * 0.1)
    layout = step_layout(d)
    runner = PolicyRunner("default", d.spec, d.obs_space, d.act_space, board, "numpy", seed=0)
    link = Link(layout)
    server = InferenceServer({"default": PolicyServing(runner, d.obs_space, SlotPool(), link, sample_steps=50)},
                             max_batch=64, max_wait_s=0.0, on_policy=False)
    areas = []
    for i in range(2):
        path = f"{tmp}/lanes{i}"
        area = LaneArea.create(path, LaneLayout(layout), 4)
        fd = os.open(path, os.O_RDWR)
        server.add(ServedArea(i, area, "default", Doorbell.create()), fd)
        os.close(fd)
        areas.append(area)
    return server, areas, link


@settings(max_examples=150, deadline=None, database=None)
@given(writes=st.lists(st.tuples(st.integers(0, 4095), st.binary(min_size=1, max_size=64)), max_size=12),
       turns=st.integers(1, 4))
def test_scribbled_lanes_are_answered_or_refused_and_spare_the_other_client(writes, turns):
    with tempfile.TemporaryDirectory() as tmp:
        server, (hostile, good), link = serving(tmp)
        page = np.ndarray((hostile.segment.size - hostile.start,), np.uint8, buffer=hostile.segment.buf,
                          offset=hostile.start)  # its lanes and the rest of their last page
        for offset, data in writes:
            page[offset:offset + len(data)] = np.frombuffer(data, np.uint8)[:len(page) - offset]
            hostile.publish(0)
        for t in range(turns):
            good.lanes["obs"]["obs"][1] = OBS + 0.01 * t
            good.lanes["op"][1], good.lanes["reward"][1] = (OP_START if t == 0 else OP_STEP), 1.0
            good.publish(1)
            server.serve_once()
            assert good.answered(1) and good.lanes["status"][1] == STATUS_OK
            assert good.lanes["action"][1][0] in (0.0, 1.0)
        records = concat(link.records, link.layout)
        assert np.isfinite(records["reward"]).all() and np.isfinite(records["obs"]["obs"]).all()
        server.close()
