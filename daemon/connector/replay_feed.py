"""The off-policy connector of one policy: episode ring → segments → n-step transitions →
replay buffer (``shm.replay``). No batches, no slots, no flushes: the learner samples the
buffer while clients keep sampling, and the buffer overwrites its oldest rows, so this side
never applies backpressure beyond the episode ring's own.

Same interface as ``PolicyConnector`` (the connector loop calls ``wants_records``, ``read``,
``maybe_build`` and ``stats`` on either).
"""
from __future__ import annotations

import math
import os

import structlog

from rlinkd.daemon import messages as m
from rlinkd.daemon.connector.segments import SegmentAssembler
from rlinkd.daemon.connector.transitions import segments_to_rows
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import PolicyTopology, Topology
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.replay import ReplayBuffer, ReplayLayout
from rlinkd.shm.ring import StepRing

log = structlog.get_logger("connector")
READ_CHUNK = 1 << 15
MAX_OPEN_STEPS = 1 << 16  # an episode piece longer than this is cut (it bootstraps there)


class ReplayConnector:
    """One off-policy policy's ring reader and replay writer."""

    def __init__(self, topo: Topology, policy: PolicyTopology, ctx: RoleContext) -> None:
        self.policy, self.ctx = policy, ctx
        self.ring = StepRing.attach(policy.episode_ring_path, expected_layout=policy.layout,
                                    doorbell=Doorbell.from_fd(topo.episode_doorbell.fd),
                                    role="consumer",
                                    space_doorbell=Doorbell.from_fd(topo.episode_space_doorbell.fd))
        self.layout = ReplayLayout(policy.layout)
        self.replay = ReplayBuffer.attach(policy.replay_path, self.layout)
        self.replay.set_pid("writer", os.getpid())
        self.assembler = SegmentAssembler(max_open_steps=MAX_OPEN_STEPS)
        self.hp = policy.definition.replay_hp
        self.segments = 0

    def wants_records(self) -> bool:
        return True

    def read(self) -> None:
        """One chunk of the ring into the replay buffer (completed segments only)."""
        if not self.ring.readable_records():
            return
        segments = self.assembler.add(self.ring.read_batch(READ_CHUNK))
        self.assembler.flush_requested = False  # (nobody waits for batches here)
        if segments:
            self.replay.append(segments_to_rows(segments, self.hp.n_step, self.hp.gamma, self.layout))
            self.segments += len(segments)

    def maybe_build(self) -> None:
        """Nothing to build: the learner samples the buffer."""

    def report_lag(self) -> None:
        """Nothing to report: a replay learner reports its own lag (``LearnerState.lag_steps``)."""

    def wait_s(self) -> float:
        """No reason to wake the loop early (the learner samples the buffer; nothing to build)."""
        return math.inf

    def stats(self) -> m.ConnectorStats:
        written = self.replay.written
        return m.ConnectorStats(0, 0, self.segments, self.assembler.open_steps(), written, (),
                                self.policy.name)
