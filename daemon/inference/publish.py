"""The publish stage of a serving turn: step records to the policies' links.

Answered training requests become step records (episodes.py); ``send`` hands them to the
policy's ``PolicyLink`` (the inference role's own ring into the collector) and, at a sample
boundary, cuts every open fragment of the policy and sends SAMPLE_READY (on-policy: the
policy is held until weights trained on it arrive). The shell (process.py) calls
``flush_links`` after each turn and before it idles, ``flush_eval`` about twice a second.
A link whose collector went away is closed here and reconnected by the shell.
"""
from __future__ import annotations

import numpy as np
import structlog

from rlinkd.daemon.inference.policy_lanes import PolicyLanes
from rlinkd.daemon.inference.policy_serving import PolicyServing
from rlinkd.shm.errors import ShmError

log = structlog.get_logger("inference")


class Publisher:
    """The publish stage over ``policies`` (by name) and their ``lanes`` (by name, filled as
    areas arrive); ``on_policy``: ``sampling.force_on_policy``."""

    def __init__(self, policies: dict[str, PolicyServing], lanes: dict[str, PolicyLanes],
                 on_policy: bool) -> None:
        self.policies, self.lanes, self.on_policy = policies, lanes, on_policy

    def send(self, name: str, records: np.ndarray, train_steps: int) -> None:
        """Hand step records to the policy's link; at a sample boundary cut every fragment
        of the policy and send SAMPLE_READY (on-policy: hold the policy)."""
        policy = self.policies[name]
        link = policy.link
        if link is None or not link.connected:
            return  # a frozen policy's served steps train nothing (as client-side)
        try:
            link.write(records, train_steps)
            if link.steps >= policy.sample_steps and not link.held:
                link.write(self.lanes[name].book.cut(), 0)
                link.sample_ready(self.on_policy or policy.off_policy)
        except (ConnectionError, OSError, ShmError) as exc:  # the collector restarts: reconnect
            log.info("inference_link_lost", policy=name, error=str(exc))
            link.close()

    def flush_links(self, only_old: bool = False) -> None:
        """Write every link's queued step records (``only_old``: those queued ``COALESCE_S``
        ago; the shell calls it after each turn, and with False before it idles)."""
        for name, policy in self.policies.items():
            link = policy.link
            if link is None or not link.connected or not link.queued:
                continue
            try:
                link.flush(only_old)
            except (ConnectionError, OSError, ShmError) as exc:  # the collector restarts: reconnect
                log.info("inference_link_lost", policy=name, error=str(exc))
                link.close()

    def flush_due_in_s(self) -> float | None:
        """Seconds until some link's queued step records are due (None: nothing queued)."""
        due = [d for p in self.policies.values() if p.link is not None and p.link.connected
               and (d := p.link.due_in_s()) is not None]
        return min(due, default=None)

    def flush_eval(self) -> None:
        """Send finished evaluation episodes (called by the shell about twice a second)."""
        links = [p.link for p in self.policies.values() if p.link is not None and p.link.connected]
        for policy in self.policies.values():
            if policy.eval_ends and links:
                links[0].send_eval(policy.eval_ends)
                policy.eval_ends = []
