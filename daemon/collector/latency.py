"""Fixed-bucket duration histograms kept by the collector and reported in ``rlinkd status``.

``Histogram.observe(seconds)`` costs one bisect and two additions (called once per RLlink
message and once per learner update, on the collector's event loop); ``report()`` is the
JSON form under ``latency`` in the status report, which the Prometheus endpoint
(``daemon.prom``) turns into histogram families. Counts per bucket are *not* cumulative
in the report (``counts[i]`` = observations with ``bounds_s[i-1] < x <= bounds_s[i]``,
the last entry is everything above the largest bound); they start at zero when the
collector starts, which a Prometheus ``rate()`` reads as a counter reset.
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence

MESSAGE_BOUNDS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                       0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds of the message buckets: a PING answers in well under a millisecond, an
on-policy EPISODES_AND_GET_STATE waits for a whole train step (seconds)."""

UPDATE_BOUNDS_S: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                                      30.0, 60.0, 120.0)
"""Upper bounds of the learner-update buckets (one PPO update: tens of ms to minutes)."""


class Histogram:
    """Observations of one duration, counted per bucket, with their sum."""

    def __init__(self, bounds_s: Sequence[float]) -> None:
        if list(bounds_s) != sorted(set(bounds_s)) or not bounds_s:
            raise ValueError(f"bucket bounds must be increasing and distinct: {bounds_s}")
        self.bounds_s = tuple(float(b) for b in bounds_s)
        self.counts = [0] * (len(self.bounds_s) + 1)
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds_s, seconds)] += 1
        self.sum_s += seconds

    def report(self) -> dict:
        return {"counts": list(self.counts), "sum_s": round(self.sum_s, 6)}


class HistogramSet:
    """One ``Histogram`` per kind (an RLlink message type: a small, fixed set of labels)."""

    def __init__(self, bounds_s: Sequence[float]) -> None:
        self.bounds_s = tuple(bounds_s)
        self.by_kind: dict[str, Histogram] = {}

    def observe(self, kind: str, seconds: float) -> None:
        histogram = self.by_kind.get(kind)
        if histogram is None:
            histogram = self.by_kind[kind] = Histogram(self.bounds_s)
        histogram.observe(seconds)

    def report(self) -> dict:
        """``{"bounds_s": [...], "by_kind": {kind: {"counts": [...], "sum_s": x}}}``."""
        return {"bounds_s": list(self.bounds_s),
                "by_kind": {kind: h.report() for kind, h in sorted(self.by_kind.items())}}
