"""Evaluation results and client metrics: what clients report that never trains (pure).

``EvalBook`` keeps, per policy, the finished evaluation episodes (EVAL_RESULTS from
evaluation clients, and from the inference role for server-side evaluation episodes):
status ``eval``, TensorBoard ``eval/*``. ``ClientMetrics`` keeps the scalars clients report
with METRICS (RELAAX's ``metrics.scalar``): status ``client_metrics``, TensorBoard
``client/<name>`` (the mean of the values received since the last write).

Limits (one client cannot grow the daemon's memory or flood TensorBoard): at most
``NAMES_PER_CLIENT`` distinct names per connection (one more is a protocol error for that
client), at most ``NAMES_TOTAL`` names daemon-wide (new ones beyond are dropped and
counted), and a token bucket per connection of ``RATE_PER_S`` values a second with a burst
of ``BURST`` (values over it are dropped and counted, no error: a chatty client is not a
broken one). Called only from the collector's event loop.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rlinkd.client_lib.protocol.codec import BadMessage
from rlinkd.client_lib.protocol.serving import EvalEpisode

NAMES_PER_CLIENT = 32
NAMES_TOTAL = 256
RATE_PER_S = 100.0
BURST = 500.0
WINDOW = 100  # episodes in the means


class TooManyMetricNames(BadMessage):
    """A client reported more distinct metric names than NAMES_PER_CLIENT."""


@dataclass
class EvalStats:
    episodes: int = 0
    returns: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    lengths: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    weights_seq_no: int = -1

    def add(self, e: EvalEpisode) -> None:
        self.episodes += 1
        self.returns.append(e.episode_return)
        self.lengths.append(e.episode_length)
        self.weights_seq_no = max(self.weights_seq_no, e.weights_seq_no)

    def report(self) -> dict:
        n = len(self.returns)
        return {"episodes": self.episodes,
                "episode_return_mean": round(sum(self.returns) / n, 3) if n else None,
                "episode_len_mean": round(sum(self.lengths) / n, 2) if n else None,
                "weights_seq_no": self.weights_seq_no}


class EvalBook:
    """Finished evaluation episodes per policy."""

    def __init__(self, policies: list[str]) -> None:
        self.known = set(policies)
        self.policies: dict[str, EvalStats] = {}

    def record(self, episodes: tuple[EvalEpisode, ...], policy_of: Callable[[str | None], str]) -> None:
        """All or nothing: BadMessage naming the first episode of an unknown policy."""
        named = []
        for i, e in enumerate(episodes):
            policy = e.policy_id or policy_of(e.agent_id)
            if policy not in self.known:
                raise BadMessage(f"EVAL_RESULTS episodes[{i}]: unknown policy {policy!r}")
            named.append((policy, e))
        for policy, e in named:
            self.policies.setdefault(policy, EvalStats()).add(e)

    def report(self) -> dict:
        """Status ``eval``: totals over every policy, and per policy."""
        total = EvalStats()
        for stats in self.policies.values():
            total.episodes += stats.episodes
            total.returns.extend(stats.returns)
            total.lengths.extend(stats.lengths)
        return total.report() | {"policies": {p: s.report() for p, s in self.policies.items()}}

    def scalars(self, default: str) -> dict[str, float]:
        """TensorBoard ``eval/*`` (the default policy's, or all together with one policy),
        ``eval/<policy>/*`` for others."""
        out: dict[str, float] = {}
        for policy, stats in self.policies.items():
            prefix = "eval/" if policy == default else f"eval/{policy}/"
            rep = stats.report()
            out[prefix + "episodes"] = float(rep["episodes"])
            for key in ("episode_return_mean", "episode_len_mean"):
                if rep[key] is not None:
                    out[prefix + key] = float(rep[key])
        return out


@dataclass
class Bucket:
    tokens: float = BURST
    last: float = field(default_factory=time.monotonic)
    names: set = field(default_factory=set)


@dataclass
class Series:
    last: float = 0.0
    total: float = 0.0
    count: int = 0
    since_write: list = field(default_factory=lambda: [0.0, 0])  # sum, n since TensorBoard took it


class ClientMetrics:
    """Client-reported scalars with per-client and daemon-wide limits."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.clients: dict[int, Bucket] = {}
        self.series: dict[str, Series] = {}
        self.dropped = 0

    def record(self, session_id: int, metrics: dict[str, float]) -> None:
        """TooManyMetricNames (a protocol error) past NAMES_PER_CLIENT; rate and daemon-wide
        name limits drop values and count them."""
        bucket = self.clients.setdefault(session_id, Bucket(last=self.clock()))
        new = set(metrics) - bucket.names
        if len(bucket.names) + len(new) > NAMES_PER_CLIENT:
            raise TooManyMetricNames(f"METRICS: more than {NAMES_PER_CLIENT} metric names from one client")
        now = self.clock()
        bucket.tokens = min(BURST, bucket.tokens + (now - bucket.last) * RATE_PER_S)
        bucket.last = now
        for name, value in metrics.items():
            if bucket.tokens < 1.0 or (name not in self.series and len(self.series) >= NAMES_TOTAL):
                self.dropped += 1
                continue
            bucket.tokens -= 1.0
            bucket.names.add(name)
            s = self.series.setdefault(name, Series())
            s.last, s.total, s.count = value, s.total + value, s.count + 1
            s.since_write[0] += value
            s.since_write[1] += 1

    def forget(self, session_id: int) -> None:
        self.clients.pop(session_id, None)

    def report(self) -> dict:
        return {name: {"last": s.last, "mean": round(s.total / s.count, 6), "count": s.count}
                for name, s in sorted(self.series.items())}

    def take_scalars(self) -> dict[str, float]:
        """TensorBoard ``client/<name>``: the mean since the last call, for names that got values."""
        out = {}
        for name, s in self.series.items():
            total, n = s.since_write
            if n:
                out[f"client/{name}"] = total / n
                s.since_write = [0.0, 0]
        return out
