"""Connector process shell: episode ring → segments → pipeline → batch slot → learner,
once per trainable policy (``PolicyConnector``), all in one loop (``Connector``).

Loop (until Stop): wait up to 50 ms for records (sleeping on the episode ring's
doorbell, which the collector rings only when we announced sleep), assemble segments, and when ``BatchBuilder``
says so, run the pipeline with the newest board weights, copy the columns into a
free shared-memory slot, mark it READY and ring the learner's doorbell. A full set
of slots stops the loop from reading the ring, which fills the ring, which slows the
collector's clients: backpressure end to end.
"""
from __future__ import annotations

import math
import time

import numpy as np
import structlog

from rlinkd.daemon import messages as m
from rlinkd.daemon.batch_schema import BatchMeta, write_columns
from rlinkd.daemon.connector.builder import BatchBuilder, behaviour_versions
from rlinkd.daemon.connector.forward import ForwardCache
from rlinkd.daemon.connector.pipeline import LearnerPipeline, PipelineContext, pipeline_for
from rlinkd.daemon.connector.replay_feed import ReplayConnector
from rlinkd.daemon.connector.segments import SegmentAssembler
from rlinkd.daemon.errors import ExitCode
from rlinkd.daemon.log import reload_level
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import PolicyTopology, Topology
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.ring import StepRing, arm_sleep, disarm_sleep
from rlinkd.shm.slots import READY, TRAINING, BatchSlots

log = structlog.get_logger("connector")
READ_CHUNK = 1 << 15
WAIT_S = 0.05
BATCH_POLL_S = 0.002  # a paced policy's batch waits for a busy learner: look this often


class PolicyConnector:
    """One trainable policy's pipeline state between loop iterations: its episode ring,
    segments, batch builder, board and slots."""

    def __init__(self, topo: Topology, policy: PolicyTopology, ctx: RoleContext) -> None:
        self.topo, self.policy, self.ctx, cfg = topo, policy, ctx, topo.cfg
        self.ring = StepRing.attach(policy.episode_ring_path, expected_layout=policy.layout,
                                    doorbell=Doorbell.from_fd(topo.episode_doorbell.fd),
                                    role="consumer",  # read_batch rings space_doorbell if the collector waits
                                    space_doorbell=Doorbell.from_fd(topo.episode_space_doorbell.fd))
        self.board = WeightsBoard.attach(policy.board_path)
        self.forwards = ForwardCache(policy.spec)
        self.slots = BatchSlots.attach(policy.slots_path)
        self.slots.reset_filling()
        self.assembler = SegmentAssembler(max_open_steps=self.slots.capacity_rows // 2)
        # on-policy clients are promised weights trained on their episodes: nothing is dropped
        off_policy = policy.off_policy or not cfg.sampling.force_on_policy
        lag = cfg.sampling.max_policy_lag if off_policy else None
        appo = policy.definition.algorithm == "appo"
        self.paced = appo and policy.definition.appo.max_lead_steps > 0  # (clients wait instead)
        self.lag_unsent = self.paced  # (a first report: a restarted collector starts from it)
        self.builder = BatchBuilder(cfg.sampling.train_batch_size, self.slots.capacity_rows, lag,
                                    freshest=appo and not self.paced)
        self.pipeline = LearnerPipeline(pipeline_for(cfg.connector.pipeline, policy.definition.algorithm,
                                                     recurrent=bool(policy.spec.state_size)))
        self.weights = np.empty(policy.spec.n_params(), np.float32)

    def wants_records(self) -> bool:
        """False while our buffer is full: records stay in the ring (backpressure). A
        builder keeping the freshest steps (APPO) always reads (it drops its oldest instead)."""
        return self.builder.drains_freely or self.builder.buffered_steps < self.slots.capacity_rows

    def read(self) -> None:
        """Take what the ring holds (one chunk) into segments and the batch builder."""
        if self.wants_records() and self.ring.readable_records():
            self.builder.add(self.assembler.add(self.ring.read_batch(READ_CHUNK)))
            self.lag_unsent = self.paced

    def _learner_idle(self) -> bool:
        busy = (READY, TRAINING)
        return not any(self.slots.state(i) in busy for i in range(self.slots.n_slots))

    def maybe_build(self) -> None:
        if self.board.latest_seq_no() < 0:
            return  # the learner has not published weights yet: values would be garbage
        if not self.builder.should_build(self.assembler.flush_requested, self._learner_idle(),
                                         self.assembler.max_ingest_id):
            return
        slot = self.slots.acquire_free()
        if slot is None:
            return
        self.assembler.flush_requested = False
        seq, _ = self.board.read(self.weights)
        plan = self.builder.take(seq, self.assembler.max_ingest_id)
        rows = self._fill(slot, plan.segments, seq) if plan.segments else 0
        oldest, total, known = behaviour_versions(plan.segments)
        meta = BatchMeta(ingest_cutoff=plan.cutoff, episodes=len(plan.segments),
                         dropped_episodes=plan.dropped_episodes, values_seq_no=seq,
                         behaviour_min=oldest, behaviour_sum=total, behaviour_steps=known)
        self.slots.mark_ready(slot, rows, meta.as_slot_meta())
        self.ctx.send("learner", m.BatchReady(slot, self.policy.name))
        self.lag_unsent = self.paced

    def _fill(self, slot: int, segments, seq: int) -> int:
        p, ppo = self.policy, self.policy.definition.ppo
        appo = p.definition.appo
        pctx = PipelineContext(p.obs_space, p.act_space, p.spec, self.weights, seq, ppo.gamma,
                               ppo.gae_lambda, ppo.normalize_advantages,
                               self.forwards.get(self.weights, seq), appo.vtrace_rho_clip,
                               appo.vtrace_c_clip)
        return write_columns(self.slots.columns(slot), self.pipeline(segments, pctx), p.spec)

    def report_lag(self) -> None:
        """A paced policy (``appo.max_lead_steps``): after every turn that read records or
        built a batch, tell the collector's pacer how many env steps wait for the learner.
        Every read is reported, even one that left the number as it was: the pacer counts
        the steps ingested since the last report as waiting. A full inbox: sent next turn."""
        if self.lag_unsent:
            lag = self.builder.buffered_steps + self.assembler.open_steps()
            self.lag_unsent = not self.ctx.try_send("collector", m.ConnectorLag(self.policy.name, lag))

    def wait_s(self) -> float:
        """How long this policy lets the loop sleep on the episode doorbell (the loop sleeps
        at most WAIT_S anyway): paced, with a batch waiting for a busy learner, BATCH_POLL_S
        (its clients are held, so no record wakes the loop when the learner frees its slot)."""
        if self.paced and self.builder.buffered_steps >= self.builder.train_batch_size and not self._learner_idle():
            return BATCH_POLL_S
        return math.inf

    def stats(self) -> m.ConnectorStats:
        b = self.builder
        return m.ConnectorStats(
            b.dropped_episodes, b.dropped_steps, b.batches,
            b.buffered_steps + self.assembler.open_steps(), b.trained_steps,
            tuple(self.slots.state(i) for i in range(self.slots.n_slots)), self.policy.name)


class Connector:
    """Every trainable policy's ``PolicyConnector``, served by one loop: their episode rings
    share one doorbell, so the loop sleeps until any of them has records."""

    def __init__(self, topo: Topology, ctx: RoleContext) -> None:
        self.topo, self.ctx = topo, ctx
        self.policies: list[PolicyConnector | ReplayConnector] = [
            ReplayConnector(topo, p, ctx) if p.uses_replay else PolicyConnector(topo, p, ctx)
            for p in topo.trainable()]
        self.doorbell = Doorbell.from_fd(topo.episode_doorbell.fd)
        self.next_stats = 0.0

    def step(self) -> None:
        """One loop iteration: wait (up to WAIT_S) for records, read, maybe build, maybe report."""
        if any(p.wants_records() for p in self.policies):
            self._wait_readable(min(WAIT_S, *(p.wait_s() for p in self.policies)))
        else:  # backpressure: leave records in the rings until the learner frees a slot
            time.sleep(WAIT_S / 10)
        for policy in self.policies:
            policy.read()
            policy.maybe_build()
            policy.report_lag()
        self._maybe_report()

    def _wait_readable(self, timeout_s: float) -> None:
        """Sleep on the shared doorbell unless a ring we want to read has records."""
        rings = [p.ring for p in self.policies if p.wants_records()]
        if len(rings) == 1:  # one policy: the ring's own wait (spins briefly before sleeping)
            rings[0].wait_readable(timeout_s)
            return
        if any(r.readable_records() for r in rings):
            return
        if not arm_sleep(rings):
            self.doorbell.wait(timeout_s)
        disarm_sleep(rings)
        self.doorbell.drain()

    def _maybe_report(self) -> None:
        now = time.monotonic()
        if now < self.next_stats:
            return
        self.next_stats = now + self.topo.cfg.daemon.status_interval_s
        for policy in self.policies:
            self.ctx.try_send("collector", policy.stats())


def run(topo: Topology, ctx: RoleContext) -> ExitCode:
    """The connector's process loop."""
    conn = Connector(topo, ctx)
    handle = m.Router("connector", {m.Stop: lambda _msg: ctx.stop.set(),
                                    m.Reload: lambda msg: reload_level(msg.changes, "connector")})
    log.info("connector_ready", pipeline=list(topo.cfg.connector.pipeline))
    while not ctx.stop.is_set():
        ctx.heartbeat()
        conn.step()
        for msg in ctx.inbox.drain():
            handle(msg)
    return ExitCode.OK
