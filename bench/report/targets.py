"""Every pass/fail target of the benchmarks, each declared once.

The report's met/MISSED lines (``bench.report.section``), the transport table's target
column and the soak's pass check all read these declarations; nothing else writes a
target's number. A ``Target`` is absolute (a measured value against ``bound`` in
``unit``); a ``RelativeTarget`` bounds an rlinkd figure by ``factor`` times the best
RLlib figure of the same measure (issue 5's comparisons).
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """``name``: what is measured; met when value ``comparison`` bound (``>=`` or ``<=``)."""

    name: str
    bound: float
    unit: str
    comparison: str
    issue: int

    def met(self, value: float) -> bool:
        return _COMPARE[self.comparison](value, self.bound)

    def bound_text(self) -> str:
        """'≥ 1,000,000 steps/s', '≤ 30 µs', '≤ 10 %'."""
        unit = f" {self.unit}" if self.unit else ""
        return f"{_SYMBOL[self.comparison]} {self.bound:,.10g}{unit}"

    def line(self, value: float | None, shown: str, context: str = "") -> str:
        """The report line: '- NAME ≤ BOUND CONTEXT: SHOWN — **met**' (or not measured)."""
        head = f"- {self.name} {self.bound_text()}{context}"
        if value is None:
            return f"{head}: **not measured**"
        return f"{head}: {shown} — **{'met' if self.met(value) else 'MISSED'}**"


@dataclass(frozen=True)
class RelativeTarget:
    """rlinkd's ``measure`` ``comparison`` ``factor`` × the best RLlib's (best = ``best_of``)."""

    name: str
    measure: str
    factor: float
    against: str
    comparison: str
    best_of: Callable
    issue: int

    def text(self) -> str:
        """'wall time ≤ 1/5 of the faster RLlib's', 'env steps/s ≥ 5 × RLlib's'."""
        if self.factor == 1:
            scale = ""
        elif self.factor > 1:
            scale = f"{self.factor:g} × "
        else:
            scale = f"1/{round(1 / self.factor)} of "
        return f"{self.name} {_SYMBOL[self.comparison]} {scale}{self.against}"

    def bound(self, rllib_values: list[float]) -> float:
        return self.best_of(rllib_values) * self.factor

    def met(self, value: float, bound: float) -> bool:
        return _COMPARE[self.comparison](value, bound)


_COMPARE = {">=": operator.ge, "<=": operator.le}
_SYMBOL = {">=": "≥", "<=": "≤"}

# ---------------------------------------------------------------- issue 3: transport
SHM_SINGLE = Target("shm single steps", 1_000_000, "steps/s", ">=", 3)
SHM_BATCH = Target("shm batches of 1,024", 20_000_000, "steps/s", ">=", 3)
WAKEUP_P50 = Target("wake-up latency p50 (doorbell FIFO)", 30.0, "µs", "<=", 3)
IDLE_CPU = Target("idle daemon CPU", 2.0, "% of a core", "<=", 3)

# ---------------------------------------------------------------- issue 5: time to solve, latency
SOLVE = (
    RelativeTarget("wall time", "wall_s", 0.2, "the faster RLlib's", "<=", min, 5),
    RelativeTarget("env steps", "env_steps", 1.0, "the more sample-efficient RLlib's", "<=", min, 5),
    RelativeTarget("env steps/s", "steps_per_s", 5.0, "RLlib's", ">=", max, 5),
    RelativeTarget("summed peak RSS", "peak_rss_mb", 1 / 3, "RLlib's", "<=", min, 5),
)
SET_STATE_P50 = Target("SET_STATE reply (on-policy, 500-step batch, excluding training) p50", 5.0, "ms",
                       "<=", 5)
CLIENTS_64_P99 = Target("64 concurrent TCP clients, p99", 50.0, "ms", "<=", 5)
RLLIB_CLIENT_SOLVED = Target("RLlib 2.48's dummy client trains against rlinkd to client-side mean ≥ 450 in",
                             100.0, "% of runs", ">=", 5)

# ---------------------------------------------------------------- issue 6: reliability
SOAK_RSS_GROWTH = Target("soak: summed RSS growth after warm-up", 10.0, "%", "<=", 6)
"""Percent of the summed RSS at the end of the warm-up."""

TRANSPORT = (SHM_SINGLE, SHM_BATCH, WAKEUP_P50, IDLE_CPU)

# ---------------------------------------------------------------- issue 15: connection floods
FLOOD_HANDSHAKE = Target("a real client's connect → PING → SET_STATE with 1,000 silent sockets open, median",
                         1000.0, "ms", "<=", 15)

# ---------------------------------------------------------------- issue 10: composite spaces, images
IMAGE_SHM = Target("84x84x3 uint8 image steps into the episode ring over shared memory", 50_000, "steps/s",
                   ">=", 10)
IMAGE_TCP = Target("84x84x3 uint8 image steps into the episode ring over TCP (compact arrays)", 5_000,
                   "steps/s", ">=", 10)
IMAGE = (IMAGE_SHM, IMAGE_TCP)

ABSOLUTE = (*TRANSPORT, SET_STATE_P50, CLIENTS_64_P99, RLLIB_CLIENT_SOLVED, SOAK_RSS_GROWTH, FLOOD_HANDSHAKE,
            *IMAGE)
