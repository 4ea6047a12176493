"""A PPO/APPO policy's learner as one rank of a job of several daemons (``[cluster]``
world_size > 1): its part of the job's rounds (``job_shell.JobShell``).

In a round the policy enters with its connector's oldest ready batch, or with none. Its
update's first collective exchanges the row counts: when no rank has rows nothing is
trained; otherwise every rank runs the job's update (``job_core.JobRankLearner.update``),
bumps ``weights_seq_no`` and publishes, so the weights and the sequence number are the same
on every rank and any rank's clients get the job's newest policy. A round that does not run
(a member lost, or this rank detached from rank 0) releases its batch untrained: its clients
go on with the last weights.
"""
from __future__ import annotations

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

    def __init__(self, policy: PolicyTopology, cfg: Config, ctx: RoleContext, job: Any) -> None:
        self.cluster = cfg.cluster
        self._join_state(job)
        super().__init__(policy, cfg, ctx)

    def _make_learner(self, policy: PolicyTopology, cfg: Config) -> Any:
        """The core, built with the job (joined by ``job_shell`` after boot)."""
        from rlinkd.daemon.learner.job_core import JobRankLearner
        return JobRankLearner(policy.spec, policy.definition.ppo, self.job,
                              device=self.placement.device, seed=cfg.learner.seed + self.cluster.rank,
                              torch_threads=cfg.learner.torch_threads)

    def _job_core(self) -> JobRankLearner:
        return self.learner

    def _announce(self) -> None:
        self._publish()
        self._tell_collector(-1, None)

    # ------------------------------------------------------------ rounds (job_shell)
    def round_entry(self) -> int | None:
        """This policy's entry into the next round: its oldest ready batch, if any."""
        return self.slots.take_ready()

    @staticmethod
    def round_wanted(slot: int | None) -> bool:
        return slot is not None

    def run_round(self, slot: int | None) -> bool:
        """This policy's update in the round; True if it had a batch. RuntimeError (the
        slot still taken) when a collective fails."""
        self.train_slot(slot)
        return slot is not None

    def release_untrained(self, slot: int | None) -> None:
        """A round that did not run: the batch goes back untrained (its clients go on)."""
        if slot is not None:
            self._release_untrained(slot)

    def between_rounds(self) -> None:
        """Nothing to report between rounds."""

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
