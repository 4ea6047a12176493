"""A trainable policy's learner as a member of a job of several daemons: what every
algorithm's job shell shares (``job_learner.JobLearner`` for PPO/APPO batches,
``job_replay_learner.JobReplayLearner`` for DQN/SAC replay).

Joining: every formation of the group (``daemon.cluster.membership``: rank 0 serves the
store and decides each generation's members) checks that the members train the same thing
(spaces, network, algorithm and the settings that shape a step, ``SHARED_SETTINGS``: a
mismatch is a ConfigError, exit 78, on every rank); then the member with the newest weights
(highest ``weights_seq_no``, the first such member on a tie) broadcasts its training state and
sequence number. A first start that cannot serve or reach the store within
``cluster.collective_timeout_s`` is a ConfigError naming ``cluster.master``; a restarted
learner's failure is a crash, retried.

Faults: a failed collective (a member gone) makes the survivors re-form without it after
``cluster.reform_window_s``; rank 0 sees a rank asking to join before a round and the group
re-forms with it after that round. A rank that cannot reach rank 0's store detaches: it
serves its last weights and asks again every ``peer_wait_s``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import numpy as np
import structlog

from rlinkd.daemon import messages as m
from rlinkd.daemon.config import ClusterConfig
from rlinkd.daemon.errors import ConfigError
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import PolicyTopology

log = structlog.get_logger("learner")
SHARED_SETTINGS = {
    "ppo": ("minibatch_size", "num_epochs", "target_kl", "normalize_observations", "max_grad_norm"),
    "replay": ("gamma", "n_step", "publish_interval_updates", "target_update_interval_updates",
               "max_grad_norm", "double_q", "lr_end", "lr_decay_steps", "epsilon_start",
               "epsilon_end", "epsilon_decay_steps", "tau", "initial_alpha", "autotune_alpha",
               "target_entropy_per_dim")}
"""Per kind of learner, the keys of its section ([ppo], or [dqn]/[sac] where the key exists)
every rank must share: they decide the collectives an update runs, how the averaged gradient
is applied, or the schedules every rank steps by. The others ([dqn]/[sac] batch_size,
updates_per_step, learning_starts_steps, buffer_size_steps) are each rank's: its replay."""


def weights_digest(flat: np.ndarray) -> str:
    """A short digest of published weights: equal on every rank of a job in step."""
    return hashlib.sha256(np.ascontiguousarray(flat, np.float32).tobytes()).hexdigest()[:16]


def shared_settings(policy: PolicyTopology) -> tuple[str, dict[str, Any]]:
    """(the section's name, its settings every rank must share) of `policy`."""
    definition = policy.definition
    if policy.uses_replay:
        hp = definition.replay_hp
        return definition.algorithm, {k: getattr(hp, k) for k in SHARED_SETTINGS["replay"]
                                      if hasattr(hp, k)}
    return "ppo", {k: getattr(definition.ppo, k) for k in SHARED_SETTINGS["ppo"]}


def job_fingerprint(policy: PolicyTopology) -> int:
    """A 56-bit digest of what every rank must share: spaces and network, algorithm, and
    ``shared_settings``."""
    shared = {"spec": policy.spec.to_json(), "algorithm": policy.definition.algorithm,
              **shared_settings(policy)[1]}
    digest = hashlib.sha256(json.dumps(shared, sort_keys=True, default=str).encode()).digest()
    return int.from_bytes(digest[:7], "big")


class JobMember:
    """Membership of the job, mixed in before ``PolicyLearner`` or ``ReplayLearner``. The host
    provides ``_job_core()`` (whose ``take_job_state(source)`` hands a member's training
    state to the others) and ``_announce()`` (publish the weights, tell the collector)."""

    policy: PolicyTopology
    ctx: RoleContext
    name: str
    seq_no: int
    cluster: ClusterConfig
    job: Any
    detached: bool
    collective_s: float
    rows_per_rank: list[int]
    digest: str

    def _join_state(self) -> None:
        """The job's fields, before the core is built (``_connect`` fills ``job``)."""
        self.job = None
        self.detached = False  # a rank other than 0 that lost rank 0: serves its last weights
        self.rows_per_rank, self.collective_s, self.digest = [], 0.0, ""

    def _connect(self, device: str) -> Any:
        """Reach the job's store (rank 0 serves it); on a first start a failure is a
        ConfigError naming ``cluster.master``."""
        import torch

        from rlinkd.daemon.cluster.job import Job
        first_join = self._first_join(self.policy)
        try:
            self.job = Job.connect(self.cluster, torch.device(device))
        except (RuntimeError, ValueError) as exc:
            if first_join:
                raise ConfigError(f"cluster.master = {self.cluster.master!r}: rank "
                                  f"{self.cluster.rank} could not "
                                  f"{'serve' if self.cluster.rank == 0 else 'reach'} the job's "
                                  f"rendezvous within {self.cluster.collective_timeout_s:g} s "
                                  f"({exc})") from None
            raise
        return self.job

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
            section, settings = shared_settings(self.policy)
            self.job.close()
            raise ConfigError(f"cluster.world_size: rank {self.cluster.rank} and rank(s) {others} "
                              f"train different spaces, networks, learner.algorithm or {section}."
                              f"{'/'.join(settings)}: every rank's config must agree")

    # ------------------------------------------------------------ membership
    def boot(self, checkpoint: str) -> None:
        """Resume and adopt the board as a daemon alone does, then enter the job (rank 0
        waits up to the collective timeout for every rank the first time)."""
        super().boot(checkpoint)  # type: ignore[misc]
        self._enter(self.cluster.collective_timeout_s)

    def _enter(self, window_s: float) -> None:
        """Form the next generation's group, check it trains one thing, take the newest
        member's state and sequence number, publish."""
        self.job.enter(window_s, self.ctx.heartbeat)
        self._check_same_job()
        seq_nos = self.job.gather(self.seq_no)
        source = seq_nos.index(max(seq_nos))
        self._job_core().take_job_state(source)
        self.seq_no = max(seq_nos)
        self._announce()
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

    # ------------------------------------------------------------ reports
    def _by_daemon_rank(self, rows: list[int]) -> list[int]:
        """Rows per member (group order) as rows per daemon rank (0 for a non-member)."""
        out = [0] * self.cluster.world_size
        for member, n in zip(self.job.members, rows):
            out[member] = int(n)
        return out

    def state(self) -> m.LearnerState:
        """The base report plus the ``cluster`` section of ``rlinkd status``'s learner."""
        return dataclasses.replace(super().state(), cluster=self.cluster_report())  # type: ignore[misc]

    def cluster_report(self) -> m.ClusterState:
        job = self.job
        return m.ClusterState(world_size=self.cluster.world_size, rank=self.cluster.rank,
                              members=tuple(job.members) if job is not None else (),
                              generation=job.generation if job is not None else 0,
                              collective_time_s=self.collective_s,
                              rows_per_rank=tuple(self.rows_per_rank), weights_digest=self.digest)

    def close(self) -> None:
        super().close()  # type: ignore[misc]
        if self.job is not None:
            self.job.close()

    # provided by the host
    def _job_core(self) -> Any:
        raise NotImplementedError

    def _announce(self) -> None:
        raise NotImplementedError
