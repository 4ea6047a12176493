"""Pacing of off-policy sampling (``dqn.max_lead_steps``): the collector holds a sampling
client of such a policy while its learner is further behind its updates-to-data schedule
than that many env steps, so the ratio it trains at is the configured one even when clients
could outrun it. Off by default (0): DQN's clients never wait.

The learner reports its lag (``LearnerState.lag_steps``) with every publication; a held
client is released by the first report within the limit, or after ``max_wait_s`` (a learner
that stopped reporting must not stall the clients forever). Event-loop side only.
"""
from __future__ import annotations

import asyncio
import time


class Pacer:
    def __init__(self, limits: dict[str, int], max_wait_s: float) -> None:
        self.limits = {p: n for p, n in limits.items() if n > 0}  # policy -> max lead steps
        self.max_wait_s = max_wait_s
        self.lag: dict[str, int] = {}
        self.events: dict[str, asyncio.Event] = {}
        self.held = 0  # samples held so far (status)

    def on_report(self, policy: str, lag_steps: int | None) -> None:
        """A learner's report (WeightsPublished): release the waiters it lets go."""
        if policy not in self.limits or lag_steps is None:
            return
        self.lag[policy] = lag_steps
        if lag_steps <= self.limits[policy] and policy in self.events:
            self.events[policy].set()

    async def wait(self, policies) -> None:
        """Until every paced one of ``policies`` is within its limit (or max_wait_s passed)."""
        deadline = time.monotonic() + self.max_wait_s
        for policy in policies:
            limit = self.limits.get(policy)
            if limit is None:
                continue
            if self.lag.get(policy, 0) > limit:
                self.held += 1
            while self.lag.get(policy, 0) > limit and (left := deadline - time.monotonic()) > 0:
                event = self.events.setdefault(policy, asyncio.Event())
                event.clear()
                try:
                    await asyncio.wait_for(event.wait(), left)
                except TimeoutError:
                    return
