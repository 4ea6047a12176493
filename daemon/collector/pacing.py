"""Pacing of off-policy sampling (``dqn.max_lead_steps``, ``sac.max_lead_steps``,
``appo.max_lead_steps``): the collector holds a sampling client of such a policy while its
learner is more than that many env steps behind, so clients cannot outrun the learner (a
replay learner trains at its configured updates-to-data ratio; an APPO learner always has a
fresh batch but no backlog to drop, and keeps the CPU it shares with co-located clients).
Off by default (0): clients never wait.

Reports: a replay learner reports its lag behind its schedule (``LearnerState.lag_steps``)
with every publication (and about once a second while idle); the connector reports an APPO
policy's steps waiting for the learner (``ConnectorLag``) whenever that changes. The steps
the collector ingested since the last report count on top, so samples arriving between
reports cannot slip past the limit together. A held client is released by the first report
within the limit, or after ``max_wait_s`` (a learner that stopped reporting must not stall
the clients forever). Event-loop side only.
"""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlinkd.daemon.wiring import PolicyTopology


def pace_limit(policy: PolicyTopology) -> int:
    """A policy's pacing limit in env steps (0: not paced): its algorithm's ``max_lead_steps``."""
    d = policy.definition
    if policy.uses_replay:
        return d.replay_hp.max_lead_steps
    return d.appo.max_lead_steps if d.algorithm == "appo" else 0


class Pacer:
    def __init__(self, limits: dict[str, int], max_wait_s: float,
                 steps_of=lambda policy: 0) -> None:
        self.limits = {p: n for p, n in limits.items() if n > 0}  # policy -> max lead steps
        self.max_wait_s = max_wait_s
        self.steps_of = steps_of  # env steps ingested for a policy so far (the collector's count)
        self.lag: dict[str, int] = {}
        self.base: dict[str, int] = {}  # steps_of(policy) at its last report
        self.events: dict[str, asyncio.Event] = {}
        self.held = 0  # samples held so far (status)

    def report(self) -> dict:
        """Status keys: samples held so far (a sampling client waited for its learner)."""
        return {"paced_samples": self.held}

    def on_report(self, policy: str, lag_steps: int | None) -> None:
        """A learner's report (WeightsPublished): release the waiters it lets go."""
        if policy not in self.limits or lag_steps is None:
            return
        self.lag[policy], self.base[policy] = lag_steps, self.steps_of(policy)
        if lag_steps <= self.limits[policy] and policy in self.events:
            self.events[policy].set()

    def behind(self, policy: str) -> int:
        """The learner's last reported lag plus what was ingested since."""
        return self.lag.get(policy, 0) + self.steps_of(policy) - self.base.get(policy, 0)

    async def wait(self, policies) -> None:
        """Until every paced one of ``policies`` is within its limit (or max_wait_s passed)."""
        deadline = time.monotonic() + self.max_wait_s
        for policy in policies:
            limit = self.limits.get(policy)
            if limit is None:
                continue
            if self.behind(policy) > limit:
                self.held += 1
            while self.behind(policy) > limit and (left := deadline - time.monotonic()) > 0:
                event = self.events.setdefault(policy, asyncio.Event())
                event.clear()
                try:
                    await asyncio.wait_for(event.wait(), left)
                except TimeoutError:
                    return
