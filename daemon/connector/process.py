"""Connector process shell: episode ring → segments → pipeline → batch slot → learner.

Loop (until Stop): wait up to 50 ms for records (sleeping on the episode ring's
doorbell, which the collector rings only when we announced sleep), assemble segments, and when ``BatchBuilder``
says so, run the pipeline with the newest board weights, copy the columns into a
free shared-memory slot, mark it READY and ring the learner's doorbell. A full set
of slots stops the loop from reading the ring, which fills the ring, which slows the
collector's clients: backpressure end to end.
"""
from __future__ import annotations

import time

import numpy as np
import structlog

from rlinkd.daemon import messages as m
from rlinkd.daemon.batch_schema import BatchMeta, write_columns
from rlinkd.daemon.connector.builder import BatchBuilder, behaviour_versions
from rlinkd.daemon.connector.forward import ForwardCache
from rlinkd.daemon.connector.pipeline import LearnerPipeline, PipelineContext
from rlinkd.daemon.connector.segments import SegmentAssembler
from rlinkd.daemon.errors import ExitCode
from rlinkd.daemon.log import reload_level
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import Topology
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.ring import StepRing
from rlinkd.shm.slots import READY, TRAINING, BatchSlots

log = structlog.get_logger("connector")
READ_CHUNK = 1 << 15
WAIT_S = 0.05


class Connector:
    """The connector's state between loop iterations."""

    def __init__(self, topo: Topology, ctx: RoleContext) -> None:
        self.topo, self.ctx, cfg = topo, ctx, topo.cfg
        self.ring = StepRing.attach(topo.episode_ring_path, expected_layout=topo.layout,
                                    doorbell=Doorbell.from_fd(topo.episode_doorbell.fd),
                                    role="consumer",  # read_batch rings space_doorbell if the collector waits
                                    space_doorbell=Doorbell.from_fd(topo.episode_space_doorbell.fd))
        self.board = WeightsBoard.attach(topo.board_path)
        self.forwards = ForwardCache(topo.policy_spec)
        self.slots = BatchSlots.attach(topo.slots_path)
        self.slots.reset_filling()
        self.assembler = SegmentAssembler(max_open_steps=self.slots.capacity_rows // 2)
        # on-policy clients are promised weights trained on their episodes: nothing is dropped
        lag = None if cfg.sampling.force_on_policy else cfg.sampling.max_policy_lag
        self.builder = BatchBuilder(cfg.sampling.train_batch_size, self.slots.capacity_rows, lag)
        self.pipeline = LearnerPipeline(cfg.connector.pipeline)
        self.weights = np.empty(topo.policy_spec.n_params(), np.float32)
        self.next_stats = 0.0

    def step(self) -> None:
        """One loop iteration: read (unless our buffer is full), maybe build, maybe report."""
        if self.builder.buffered_steps < self.slots.capacity_rows:
            if self.ring.wait_readable(WAIT_S):
                self.builder.add(self.assembler.add(self.ring.read_batch(READ_CHUNK)))
        else:  # backpressure: leave records in the ring until the learner frees a slot
            time.sleep(WAIT_S / 10)
        self._maybe_build()
        self._maybe_report()

    def _learner_idle(self) -> bool:
        busy = (READY, TRAINING)
        return not any(self.slots.state(i) in busy for i in range(self.slots.n_slots))

    def _maybe_build(self) -> None:
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
        self.ctx.send("learner", m.BatchReady(slot))

    def _fill(self, slot: int, segments, seq: int) -> int:
        cfg = self.topo.cfg
        pctx = PipelineContext(self.topo.obs_space, self.topo.act_space, self.topo.policy_spec,
                               self.weights, seq, cfg.ppo.gamma, cfg.ppo.gae_lambda,
                               cfg.ppo.normalize_advantages, self.forwards.get(self.weights, seq))
        return write_columns(self.slots.columns(slot), self.pipeline(segments, pctx),
                             self.topo.policy_spec)

    def _maybe_report(self) -> None:
        now = time.monotonic()
        if now < self.next_stats:
            return
        self.next_stats = now + self.topo.cfg.daemon.status_interval_s
        b = self.builder
        self.ctx.try_send("collector", m.ConnectorStats(
            b.dropped_episodes, b.dropped_steps, b.batches,
            b.buffered_steps + self.assembler.open_steps(), b.trained_steps,
            tuple(self.slots.state(i) for i in range(self.slots.n_slots))))


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
