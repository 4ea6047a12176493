"""The learner process's policy as one rank of a job of several daemons (``[cluster]``
world_size > 1): the thin shell around ``daemon.cluster``.

Rounds: every update of the job is a round all ranks enter. A rank enters at once when its
connector has a batch ready; a rank without one enters after ``cluster.peer_wait_s`` with no
rows. The round's first collective exchanges the row counts: when no rank has rows nothing
is trained; otherwise every rank runs the job's update (``Learner.update``), bumps
``weights_seq_no`` and publishes, so the weights and the sequence number are the same on every
rank and any rank's clients get the job's newest policy. A rank without clients so costs the
others at most ``peer_wait_s`` plus one idle inbox wait (``process.IDLE_WAIT_S``) per
update.

Joining, faults and reports: ``job_member.JobMember``. A rank that lost rank 0 releases its
batches untrained (its clients go on with the last weights).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import structlog

from rlinkd.daemon import messages as m
from rlinkd.daemon.batch_schema import BatchMeta, read_columns
from rlinkd.daemon.config import Config
from rlinkd.daemon.learner.job_member import JobMember, weights_digest
from rlinkd.daemon.learner.policy_learner import PolicyLearner
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import PolicyTopology

if TYPE_CHECKING:
    from rlinkd.daemon.learner.job_core import JobRankLearner

log = structlog.get_logger("learner")


class JobLearner(JobMember, PolicyLearner):
    """A ``PolicyLearner`` whose updates are the job's (see the module docstring)."""

    learner: JobRankLearner

    def __init__(self, policy: PolicyTopology, cfg: Config, ctx: RoleContext) -> None:
        self.cluster = cfg.cluster
        self._join_state()
        super().__init__(policy, cfg, ctx)
        self.next_round = 0.0

    def _make_learner(self, policy: PolicyTopology, cfg: Config) -> Any:
        """Reach the job's store first (rank 0 serves it); the core is built with the job."""
        from rlinkd.daemon.learner.job_core import JobRankLearner
        self._connect(self.placement.device)
        return JobRankLearner(policy.spec, policy.definition.ppo, self.job,
                              device=self.placement.device, seed=cfg.learner.seed + self.cluster.rank,
                              torch_threads=cfg.learner.torch_threads)

    def _job_core(self) -> JobRankLearner:
        return self.learner

    def _announce(self) -> None:
        self._publish()
        self._tell_collector(-1, None)

    # ------------------------------------------------------------ training
    def train_ready(self) -> bool:
        """Enter the job's next round with the oldest ready batch, or with none once
        ``peer_wait_s`` has passed since this rank's last round; True if it had a batch.
        Detached, a batch is released untrained (its clients go on with the last weights)."""
        slot = self.slots.take_ready()
        if slot is None and time.monotonic() < self.next_round:
            return False
        self.next_round = time.monotonic() + self.cluster.peer_wait_s
        if self.detached:
            if slot is not None:
                self._release_untrained(slot)
            self._rejoin()
            return slot is not None
        self.job.reform_wanted = self.cluster.rank == 0 and self.job.newcomers_waiting()
        try:
            self.train_slot(slot)
        except RuntimeError as exc:  # a member is gone (its sockets closed, or the timeout)
            if slot is not None:
                self._release_untrained(slot)
            self._reform(f"collective failed: {str(exc).splitlines()[0] if str(exc) else exc!r}")
            return True
        if self.job.reform_agreed:
            self.job.reform_agreed = False
            self._reform("a rank asks to join")
        return slot is not None

    def _release_untrained(self, slot: int) -> None:
        meta = BatchMeta.from_slot_meta(self.slots.meta(slot))
        self.slots.release(slot)
        self._tell_collector(meta.ingest_cutoff, None)

    def redo_orphans(self) -> None:
        """A batch a killed predecessor left in TRAINING is released untrained: the job has
        moved on since, and a round must be entered by every rank."""
        for slot in self.slots.in_training():
            log.warning("releasing_orphaned_batch", policy=self.name, slot=slot)
            self._release_untrained(slot)

    def train_slot(self, slot: int | None) -> None:
        """One round of the job: this rank's batch in `slot` (None or an empty flush: no
        rows); publish when the job trained, release the slot, notify the collector.
        RuntimeError (slot still taken) when a collective fails."""
        rows = self.slots.rows(slot) if slot is not None else 0
        meta = BatchMeta.from_slot_meta(self.slots.meta(slot)) if slot is not None else None
        batch = (read_columns(self.slots.columns(slot), rows, self.policy.spec)
                 if slot is not None and rows else None)
        update, trained_from = None, self.seq_no
        try:
            stats = self.learner.update(batch, on_step=self.ctx.heartbeat)
        except ValueError as exc:  # non-finite: the same on every rank, nobody counts it
            log.error("batch_rejected", policy=self.name, rows=rows, error=str(exc))
            self.rejected_batches += int(rows > 0)
            stats = {}
        if stats.get("refused"):
            log.error("batch_rejected", policy=self.name, rows=rows, error=stats["refused"])
            self.rejected_batches += 1
        if "job_rows" in stats:
            self.seq_no += 1
            self._publish()
            self.collective_s = float(stats["collective_time_s"])
            self.rows_per_rank = self._by_daemon_rank(stats["rows_per_rank"])
            lag = meta.policy_lag(trained_from) if meta is not None and rows else (None, None)
            update = m.train_stats({k: float(v) for k, v in stats.items()
                                    if isinstance(v, (int, float))}, *lag)
        if slot is not None:
            self.slots.release(slot)
        if slot is not None or update is not None:
            self._tell_collector(meta.ingest_cutoff if meta is not None else -1, update)
        self.ctx.heartbeat()

    def _publish(self) -> None:
        flat = self.learner.flat_weights()
        self.board.publish(self.seq_no, flat)
        self.digest = weights_digest(flat)
