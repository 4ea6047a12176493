"""``inference.native_parts``: each native part of the inference role can be switched off on
its own (for an isolated A/B), the Python path then serves the same answers and step records,
and the role reports the parts serving now. The direct part's on/off twin is
tests/unit/test_direct_native.py (``DirectConnections(native=...)``); a whole daemon with
every part off is tests/wiring/test_serving_python.py."""
from __future__ import annotations

import os

import numpy as np
import pytest

from rlinkd.daemon.config import NATIVE_PARTS, ConfigError, load_config
from rlinkd.daemon.inference import netnative
from rlinkd.daemon.inference.backend import PolicyRunner, candidates
from rlinkd.daemon.inference.episodes import SlotPool
from rlinkd.daemon.inference.policy_lanes import ServedArea
from rlinkd.daemon.inference.policy_serving import PolicyServing
from rlinkd.daemon.inference.server import InferenceServer
from rlinkd.daemon.wiring import step_layout
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.lanes import EVALUATE, OP_END, OP_START, OP_STEP, TERMINATED, LaneArea, LaneLayout
from tests.unit.test_inference_server import FakeLink
from tests.unit.test_lonestep import make_board

needs_native = pytest.mark.skipif(not netnative.available(), reason="the _native extension is not built")
LANES = 4
ANSWER = ("status", "action", "weights_seq_no", "resp_seq")


def config(parts, backend: str = "auto"):
    return load_config(None, [("inference", "native_parts", parts), ("inference", "backend", backend)])


def test_every_part_is_on_by_default_and_a_list_picks_some():
    assert load_config(None, []).inference.native_parts == NATIVE_PARTS
    assert config("scan, direct").inference.native_parts == ("scan", "direct")
    assert config([]).inference.native_parts == ()


@pytest.mark.parametrize("parts, backend, words", [
    (["scan", "sacn"], "auto", "must be one of"),
    (["step"], "auto", "list `net`"),
    (["scan"], "native", "needs `net`"),
])
def test_an_unknown_part_or_a_part_without_what_it_needs_is_a_config_error(parts, backend, words):
    with pytest.raises(ConfigError, match=words):
        config(parts, backend)


def test_without_net_auto_never_times_the_native_interpreter():
    d = load_config(None, [])
    from rlinkd.daemon import policies as P
    spec = P.policy_defs(d)["default"].spec
    assert "native" not in candidates(spec, gpu=False, native=False)
    assert ("native" in candidates(spec, gpu=False)) == netnative.available()


class Served:
    """One inference server over one lane area with the given native parts."""

    def __init__(self, tmp, name: str, d, board, parts: tuple[str, ...]) -> None:
        runner = PolicyRunner("default", d.spec, d.obs_space, d.act_space, board,
                              "native" if "net" in parts else "numpy", seed=7, native="net" in parts)
        self.link = FakeLink(step_layout(d))
        self.server = InferenceServer({"default": PolicyServing(runner, d.obs_space, SlotPool(), self.link,
                                                                sample_steps=5)},
                                      max_batch=64, max_wait_s=0.0, on_policy=False, native_parts=parts)
        path = str(tmp / name)
        self.area = LaneArea.create(path, LaneLayout(step_layout(d)), LANES)
        fd = os.open(path, os.O_RDWR)
        self.server.add(ServedArea(0, self.area, "default", Doorbell.create()), fd)
        os.close(fd)

    def play(self, script) -> list[tuple]:
        """Each request alone in its turn (the lone path's draws are then the batch path's);
        returns every answer."""
        answers = []
        for lane, op, obs, reward, flags in script:
            lanes = self.area.lanes
            lanes["obs"]["obs"][lane] = obs
            lanes["op"][lane], lanes["flags"][lane], lanes["reward"][lane] = op, flags, reward
            self.area.publish(lane)
            assert self.server.serve_once() == 1
            answers.append(tuple(self.area.lanes[name][lane].tobytes() for name in ANSWER))
        return answers


def script(seed: int = 0) -> list[tuple]:
    """Training and evaluation episodes on every lane, interleaved, some ending early."""
    rng, out = np.random.default_rng(seed), []
    for lane in range(LANES):
        out.append((lane, OP_START, rng.normal(size=4).astype(np.float32) * 0.3, 0.0,
                    EVALUATE if lane == 3 else 0))
    for t in range(12):
        for lane in range(LANES):
            op, flags = (OP_END, TERMINATED) if t == 11 or (lane == 1 and t == 5) else (OP_STEP, 0)
            if lane == 1 and t > 5:
                continue
            out.append((lane, op, rng.normal(size=4).astype(np.float32) * 0.3, float(t), flags))
    return out


def close_records(a: np.ndarray, b: np.ndarray) -> None:
    """Field by field: floats to rounding (native and numpy forward passes differ in the last
    bits), everything else exactly."""
    assert a.dtype == b.dtype and len(a) == len(b)
    for name in a.dtype.names:
        if a.dtype[name].names:
            close_records(a[name], b[name])
        elif a.dtype[name].base.kind == "f":
            assert np.allclose(a[name], b[name], rtol=1e-5, atol=1e-6), name
        else:
            assert np.array_equal(a[name], b[name]), name


@needs_native
@pytest.mark.parametrize("off", ["scan", "step", "net", "all"])
def test_a_part_off_serves_the_same_answers_and_records_in_python(tmp_path, off):
    d, board = make_board(tmp_path)
    parts = () if off == "all" else tuple(p for p in NATIVE_PARTS if p != off and not (off == "net" and p == "step"))
    on, without = Served(tmp_path, "on", d, board, NATIVE_PARTS), Served(tmp_path, "off", d, board, parts)
    try:
        moves = script()
        assert on.play(moves) == without.play(moves)
        close_records(on.link.all, without.link.all)
        assert on.server.stats == without.server.stats
        assert on.server.native_in_use() == {"scan", "step", "net"}
        assert without.server.native_in_use() == set(parts) - {"direct"}
    finally:
        on.server.close()
        without.server.close()
