"""daemon.collector.status: the steps/s figure does not depend on how often status is asked for."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.collector.core import CollectorCore, single_policy
from rlinkd.daemon.collector.ingest import Spaces
from rlinkd.daemon.collector.status import RATE_WINDOW_S, RateMeter, StatusBuilder
from rlinkd.daemon.config import load_config
from rlinkd.shm.records import StepLayout

TICK_S = 0.05  # the collector's tick


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_builder(clock: FakeClock) -> StatusBuilder:
    cfg = load_config(resolve_dirs=False)
    core = CollectorCore(cfg, single_policy(Spaces(Box([2], low=-1.0, high=1.0), Discrete(2),
                                                   dist_size=2), StepLayout.flat(2, 1, 2)))
    topo = SimpleNamespace(cfg=cfg, started_at=time.time())
    return StatusBuilder(topo, core, {"default": SimpleNamespace(seq_no=3)}, clock=clock)


def run_rate(polls_per_second: int, seconds: int = 30, steps_per_s: int = 1000) -> float:
    """Steady ingestion on the collector's ticks; status asked ``polls_per_second`` times
    in one burst every second; the rate reported by the last poll."""
    clock = FakeClock()
    builder = make_builder(clock)
    ticks_per_s = round(1 / TICK_S)
    for _ in range(seconds):
        for _ in range(ticks_per_s):
            clock.now += TICK_S
            builder.core.env_steps += steps_per_s // ticks_per_s
            builder.on_tick()
        for _ in range(polls_per_second):
            status = builder.build(port=1)
    return status["env_steps_per_s"]


def test_rate_is_the_same_polled_once_or_1000_times_in_a_burst():
    once, burst = run_rate(1), run_rate(1000)
    assert once == pytest.approx(1000, rel=0.05)
    assert burst == pytest.approx(once, rel=0.01)


def test_rate_meter_window_spans_its_duration_whatever_the_sampling_rate():
    dense, sparse = RateMeter(), RateMeter()
    for i in range(4000):  # 40 s: 10 steps/s, then 100 steps/s for the last 20 s
        now = i * 0.01
        total = 10 * min(now, 20.0) + 100 * max(0.0, now - 20.0)
        dense.sample(now, round(total))
        if i % 100 == 0:
            sparse.sample(now, round(total))
    assert dense.samples[-1][0] - dense.samples[0][0] == pytest.approx(RATE_WINDOW_S, abs=0.6)
    assert dense.per_s() == pytest.approx(100, rel=0.02)
    assert sparse.per_s() == pytest.approx(100, rel=0.02)


def test_rate_is_zero_before_two_samples_and_build_does_not_sample():
    clock = FakeClock()
    builder = make_builder(clock)
    for _ in range(100):
        clock.now += 1.0
        builder.core.env_steps += 100
        assert builder.build(port=1)["env_steps_per_s"] == 0.0
    assert builder.build(port=7)["port"] == 7 and builder.build(port=7)["weights_seq_no"] == 3


def role_report(errors_by_kind: dict[str, int], started_at: float = 1.0):
    from rlinkd.daemon import messages as m
    return m.InferenceStats(requests=0, actions=0, batches=0, errors=0, lanes_open=0, areas=0, held=(),
                            batch_sizes={}, backends={}, cpu_s=0.0, errors_by_kind=errors_by_kind,
                            started_at=started_at)


def test_protocol_errors_add_the_roles_and_never_go_down_when_it_restarts():
    builder = make_builder(FakeClock())
    builder.core.count_protocol_error("bad_message")
    builder.on_inference(role_report({"bad_message": 2, "frame_too_large": 1}))
    builder.on_inference(role_report({"bad_message": 3, "frame_too_large": 1}))
    status = builder.build(port=1)
    assert status["protocol_errors"] == 5
    assert status["protocol_errors_by_kind"]["bad_message"] == 4
    builder.on_inference(role_report({"bad_message": 1}, started_at=2.0))  # (a restarted role
    status = builder.build(port=1)                                          # counts from 0)
    assert status["protocol_errors"] == 6 and status["protocol_errors_by_kind"]["frame_too_large"] == 1
    builder.on_inference(role_report({"bad_message": 1, "frame_too_large": 1}, started_at=2.0))
    assert builder.build(port=1)["protocol_errors_by_kind"]["frame_too_large"] == 2  # (its own first)
