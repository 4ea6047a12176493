"""Evaluation results and client metrics: bookkeeping, limits, TensorBoard tags."""
from __future__ import annotations

import pytest

from rlinkd.client_lib.protocol.codec import BadMessage
from rlinkd.client_lib.protocol.serving import EvalEpisode, Metrics
from rlinkd.client_lib.reporting import MetricBuffer
from rlinkd.daemon import messages as m
from rlinkd.daemon.collector.evaluation import (BURST, NAMES_PER_CLIENT, NAMES_TOTAL, RATE_PER_S,
                                                ClientMetrics, EvalBook, TooManyMetricNames)
from rlinkd.daemon.metrics import scalars_from_status


def test_eval_book_counts_per_policy_and_refuses_unknown_ones():
    book = EvalBook(["default", "red"])
    book.record((EvalEpisode(10.0, 10, 3), EvalEpisode(20.0, 20, 4, policy_id="red")),
                lambda agent: "default")
    book.record((EvalEpisode(30.0, 30, 5, agent_id="x"),), lambda agent: "default")
    rep = book.report()
    assert rep["episodes"] == 3 and rep["episode_return_mean"] == 20.0
    assert rep["policies"]["default"]["episode_return_mean"] == 20.0
    assert rep["policies"]["default"]["weights_seq_no"] == 5
    with pytest.raises(BadMessage, match="unknown policy 'blue'"):
        book.record((EvalEpisode(1.0, 1), EvalEpisode(1.0, 1, policy_id="blue")), lambda a: "default")
    assert book.report()["episodes"] == 3  # all or nothing
    tags = book.scalars("default")
    assert tags["eval/episode_return_mean"] == 20.0 and tags["eval/red/episodes"] == 1.0


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_client_metrics_means_and_take_scalars():
    metrics = ClientMetrics(Clock())
    metrics.record(1, {"fps": 60.0})
    metrics.record(2, {"fps": 30.0, "sim/lag": 2.0})
    assert metrics.report()["fps"] == {"last": 30.0, "mean": 45.0, "count": 2}
    assert metrics.take_scalars() == {"client/fps": 45.0, "client/sim/lag": 2.0}
    assert metrics.take_scalars() == {}  # nothing new since


def test_names_per_client_is_a_protocol_error():
    metrics = ClientMetrics(Clock())
    metrics.record(1, {f"m{i}": 1.0 for i in range(NAMES_PER_CLIENT)})
    metrics.record(1, {"m0": 2.0})  # known names stay fine
    with pytest.raises(TooManyMetricNames):
        metrics.record(1, {"one_more": 1.0})
    metrics.record(2, {"one_more": 1.0})  # another client is not affected


def test_rate_and_daemon_wide_names_drop_and_count():
    clock = Clock()
    metrics = ClientMetrics(clock)
    for _ in range(int(BURST)):
        metrics.record(1, {"x": 1.0})
    metrics.record(1, {"x": 1.0})
    assert metrics.dropped == 1 and metrics.report()["x"]["count"] == BURST
    clock.t += 1.0  # the bucket refills at RATE_PER_S
    for _ in range(int(RATE_PER_S)):
        metrics.record(1, {"x": 1.0})
    assert metrics.dropped == 1
    for client in range(NAMES_TOTAL // NAMES_PER_CLIENT + 1):
        metrics.record(100 + client, {f"c{client}_{i}": 1.0 for i in range(NAMES_PER_CLIENT)})
    assert len(metrics.report()) == NAMES_TOTAL and metrics.dropped > 1


def test_metric_buffer_validates_and_sends_means():
    sent = []
    buf = MetricBuffer(sent.append)
    buf.add("fps", 10.0)
    buf.add("fps", 20.0)
    buf.flush()
    assert sent == [Metrics({"fps": 15.0})]
    with pytest.raises(ValueError, match="metric name"):
        buf.add("bad name", 1.0)
    with pytest.raises(ValueError, match="finite"):
        buf.add("x", float("nan"))


def test_status_scalars_reach_tensorboard_tags():
    status = m.CollectorStatus(env_steps=1, episodes=0, env_steps_per_s=0.0, episode_return_mean=None,
                               episode_len_mean=None, weights_seq_no=0, clients=0, dropped_episodes=0,
                               learner=None, update=None,
                               scalars={"eval/episode_return_mean": 5.0, "client/fps": 60.0})
    tags = scalars_from_status(status)
    assert tags["eval/episode_return_mean"] == 5.0 and tags["client/fps"] == 60.0
