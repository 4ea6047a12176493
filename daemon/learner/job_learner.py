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

Joining: every formation of the group (``daemon.cluster.membership``: rank 0 serves the
store and decides each generation's members) checks that the members train the same thing
(spaces, network, algorithm, minibatch settings: a mismatch is a ConfigError, exit 78, on
every rank); then the member with the newest weights (highest ``weights_seq_no``, the first
such member on a tie) broadcasts its training state and sequence number. A first start that
cannot serve or reach the store within ``cluster.collective_timeout_s`` is a ConfigError
naming ``cluster.master``; a restarted learner's failure is a crash, retried.

Faults: a failed collective (a member gone) makes the survivors re-form without it after
``cluster.reform_window_s``; rank 0 sees a rank asking to join before a round and the group
re-forms with it after that round. A rank that cannot reach rank 0's store detaches: it
serves its last weights, releases batches untrained, and asks again every ``peer_wait_s``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from typing import TYPE_CHECKING, Any

import numpy as np

import structlog

from rlinkd.daemon import messages as m
from rlinkd.daemon.batch_schema import BatchMeta, read_columns
from rlinkd.daemon.config import Config
from rlinkd.daemon.errors import ConfigError
from rlinkd.daemon.learner.policy_learner import PolicyLearner
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import PolicyTopology

if TYPE_CHECKING:
    from rlinkd.daemon.learner.job_core import JobRankLearner

log = structlog.get_logger("learner")
STEP_SETTINGS = ("minibatch_size", "num_epochs", "target_kl", "normalize_observations",
                 "max_grad_norm")
"""[ppo] keys every rank must share: they decide the collectives an update runs, or (the
gradient clip) how the averaged gradient is applied."""


def weights_digest(flat: np.ndarray) -> str:
    """A short digest of published weights: equal on every rank of a job in step."""
    return hashlib.sha256(np.ascontiguousarray(flat, np.float32).tobytes()).hexdigest()[:16]


def job_fingerprint(policy: PolicyTopology) -> int:
    """A 56-bit digest of what every rank must share: spaces and network, algorithm, and
    the [ppo] settings that shape an update's collectives."""
    hp = policy.definition.ppo
    shared = {"spec": policy.spec.to_json(), "algorithm": policy.definition.algorithm,
              **{key: getattr(hp, key) for key in STEP_SETTINGS}}
    digest = hashlib.sha256(json.dumps(shared, sort_keys=True, default=str).encode()).digest()
    return int.from_bytes(digest[:7], "big")


class JobLearner(PolicyLearner):
    """A ``PolicyLearner`` whose updates are the job's (see the module docstring)."""

    learner: JobRankLearner

    def __init__(self, policy: PolicyTopology, cfg: Config, ctx: RoleContext) -> None:
        self.cluster = cfg.cluster
        self.job: Any = None
        super().__init__(policy, cfg, ctx)
        self.next_round = 0.0
        self.detached = False  # a rank other than 0 that lost rank 0: serves its last weights
        self.rows_per_rank: list[int] = []
        self.collective_s = 0.0
        self.digest = ""

    def _make_learner(self, policy: PolicyTopology, cfg: Config) -> Any:
        """Reach the job's store first (rank 0 serves it); the core is built with the job."""
        import torch

        from rlinkd.daemon.cluster.job import Job
        from rlinkd.daemon.learner.job_core import JobRankLearner
        first_join = self._first_join(policy)
        try:
            self.job = Job.connect(self.cluster, torch.device(self.placement.device))
        except (RuntimeError, ValueError) as exc:
            if first_join:
                raise ConfigError(f"cluster.master = {self.cluster.master!r}: rank "
                                  f"{self.cluster.rank} could not "
                                  f"{'serve' if self.cluster.rank == 0 else 'reach'} the job's "
                                  f"rendezvous within {self.cluster.collective_timeout_s:g} s "
                                  f"({exc})") from None
            raise
        return JobRankLearner(policy.spec, policy.definition.ppo, self.job,
                              device=self.placement.device, seed=cfg.learner.seed + self.cluster.rank,
                              torch_threads=cfg.learner.torch_threads)

    @staticmethod
    def _first_join(policy: PolicyTopology) -> bool:
        from rlinkd.shm.board import WeightsBoard
        board = WeightsBoard.attach(policy.board_path)
        try:
            return board.latest_seq_no() < 0
        finally:
            board.close()

    def _check_same_job(self) -> None:
        prints = self.job.gather(job_fingerprint(self.policy))
        if len(set(prints)) > 1:
            mine = prints[self.job.index]
            others = [self.job.members[i] for i, p in enumerate(prints) if p != mine]
            self.job.close()
            raise ConfigError(f"cluster.world_size: rank {self.cluster.rank} and rank(s) {others} "
                              "train different spaces, networks, learner.algorithm or ppo."
                              f"{'/'.join(STEP_SETTINGS)}: every rank's config must agree")

    # ------------------------------------------------------------ membership
    def boot(self, checkpoint: str) -> None:
        """Resume and adopt the board as a daemon alone does, then enter the job (rank 0
        waits up to the collective timeout for every rank the first time)."""
        super().boot(checkpoint)
        self._enter(self.cluster.collective_timeout_s)

    def _enter(self, window_s: float) -> None:
        """Form the next generation's group, check it trains one thing, take the newest
        member's state and sequence number, publish."""
        self.job.enter(window_s, self.ctx.heartbeat)
        self._check_same_job()
        seq_nos = self.job.gather(self.seq_no)
        source = seq_nos.index(max(seq_nos))
        self.learner.take_job_state(source)
        self.seq_no = max(seq_nos)
        self._publish()
        self._tell_collector(-1, None)
        self.detached = False
        log.info("joined_job", policy=self.name, rank=self.cluster.rank,
                 generation=self.job.generation, members=self.job.members, seq_no=self.seq_no,
                 state_from_rank=self.job.members[source])

    def _reform(self, reason: str) -> None:
        """Re-form after a lost member or for a newcomer. A rank that cannot reach rank 0's
        store any more detaches: it serves its last weights and asks again every
        ``peer_wait_s``."""
        log.warning("job_reforming", policy=self.name, rank=self.cluster.rank, reason=reason,
                    generation=self.job.generation, members=self.job.members)
        try:
            self._enter(self.cluster.reform_window_s)
        except RuntimeError as exc:
            if self.cluster.rank == 0:
                raise
            self.job.leave_group()
            self.job.members = []
            if not self.detached:
                log.warning("job_detached", policy=self.name, rank=self.cluster.rank,
                            error=str(exc).splitlines()[0] if str(exc) else "")
            self.detached = True

    def _rejoin(self) -> None:
        try:
            self.job.reconnect(timeout_s=min(1.0, self.cluster.peer_wait_s * 2))
        except RuntimeError:
            return
        self._reform("rank 0 reachable again")

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

    def _by_daemon_rank(self, rows: list[int]) -> list[int]:
        """Rows per member (group order) as rows per daemon rank (0 for a non-member)."""
        out = [0] * self.cluster.world_size
        for member, n in zip(self.job.members, rows):
            out[member] = int(n)
        return out

    def _publish(self) -> None:
        flat = self.learner.flat_weights()
        self.board.publish(self.seq_no, flat)
        self.digest = weights_digest(flat)

    def state(self) -> m.LearnerState:
        """The base report plus the ``cluster`` section of ``rlinkd status``'s learner."""
        return dataclasses.replace(super().state(), cluster=self.cluster_report())

    def cluster_report(self) -> m.ClusterState:
        job = self.job
        return m.ClusterState(world_size=self.cluster.world_size, rank=self.cluster.rank,
                              members=tuple(job.members) if job is not None else (),
                              generation=job.generation if job is not None else 0,
                              collective_time_s=self.collective_s,
                              rows_per_rank=tuple(self.rows_per_rank), weights_digest=self.digest)

    def close(self) -> None:
        super().close()
        if self.job is not None:
            self.job.close()
