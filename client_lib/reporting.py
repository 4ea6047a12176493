"""What a client reports that never trains: evaluation returns and its own metrics.

``EvalTally`` adds up an evaluation episode's return and length and batches finished
episodes into EVAL_RESULTS (every EVAL_BATCH episodes or EVAL_PERIOD_S); ``MetricBuffer``
collects ``log_metric`` values and sends the mean per name at most every METRIC_PERIOD_S
(the daemon limits names and rate per client: see ``daemon.collector.evaluation``).
Both hand messages to a ``send`` callable (the link's); neither blocks otherwise.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.serving import (MAX_METRICS_PER_MESSAGE, EvalEpisode, EvalResults,
                                                Metrics, metric_name_error)

EVAL_BATCH = 16
EVAL_PERIOD_S = 1.0
METRIC_PERIOD_S = 0.5

Send = Callable[[codec.Message], None]


class EvalTally:
    """One evaluation agent's running episode and the finished ones not yet sent."""

    def __init__(self, send: Send, policy_id: str | None = None) -> None:
        self.send, self.policy_id = send, policy_id
        self.ret, self.length = 0.0, 0
        self.done: list[EvalEpisode] = []
        self.last_sent = time.monotonic()

    def step(self, reward: float, ended: bool, weights_seq_no: int) -> None:
        self.ret += float(reward)
        self.length += 1
        if ended:
            self.done.append(EvalEpisode(self.ret, self.length, weights_seq_no, policy_id=self.policy_id))
            self.ret, self.length = 0.0, 0
            if len(self.done) >= EVAL_BATCH or time.monotonic() - self.last_sent >= EVAL_PERIOD_S:
                self.flush()

    def abandon(self) -> None:
        """Forget the running episode (cut short by a reset: its return is not a whole
        episode's, and reporting it would bias the evaluation)."""
        self.ret, self.length = 0.0, 0

    def flush(self) -> None:
        if self.done:
            episodes, self.done = tuple(self.done), []
            self.send(EvalResults(episodes))
        self.last_sent = time.monotonic()


class MetricBuffer:
    """``log_metric`` values, sent as means per name (METRICS) at most twice a second."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.values: dict[str, list[float]] = {}
        self.last_sent = time.monotonic()

    def add(self, name: str, value: float) -> None:
        """ValueError for a bad name or a value that is not a finite number."""
        error = metric_name_error(name)
        if error:
            raise ValueError(error)
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"metric {name!r}: {value} is not a finite number")
        entry = self.values.setdefault(name, [0.0, 0])
        entry[0] += value
        entry[1] += 1
        if time.monotonic() - self.last_sent >= METRIC_PERIOD_S or len(self.values) >= MAX_METRICS_PER_MESSAGE:
            self.flush()

    def flush(self) -> None:
        if self.values:
            means = {name: total / n for name, (total, n) in self.values.items()}
            self.values = {}
            self.send(Metrics(means))
        self.last_sent = time.monotonic()
