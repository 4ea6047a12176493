"""The learner process as one rank of a job of several daemons ([cluster] world_size > 1):
every trainable policy's learner joined to one process group, trained in the job's rounds.

Rounds: collectives pair up only when every rank runs the same policy's update at the same
time, so a rank does not train its policies in turns as a daemon alone does. A round runs
every trainable policy's part in the order of their names, each with or without rows
(``job_learner.JobLearner``: its ready batch; ``job_replay_learner.JobReplayLearner``: the
steps its replay makes due). A rank enters a round as soon as some policy has work, or after
``cluster.peer_wait_s`` with none; a rank without clients so costs the others at most
``peer_wait_s`` (plus one idle inbox wait) per round.

Joining: every formation of the group (``daemon.cluster.membership``: rank 0 serves the
store and decides each generation's members) checks that the members train the same
policies (names, spaces, networks, algorithms and the settings that shape a step,
``job_member.SHARED_SETTINGS``: a member that differs from rank 0 exits 78 with a
ConfigError, and the others form the group again without it); then,
policy by policy, the member with the newest weights (highest ``weights_seq_no``; on a
tie the one that has run the most gradient steps, ``job_member.newest_member``) broadcasts
its training state and sequence number. A first start that cannot serve or reach the
store within ``cluster.collective_timeout_s`` is a ConfigError naming ``cluster.master``;
a restarted learner's failure is a crash, retried.

Faults: a failed collective (a member gone) makes the survivors re-form without it after
``cluster.reform_window_s``; rank 0 sees a rank asking to join before a round and the group
re-forms with it after that round. A rank that cannot reach rank 0's store detaches: it
serves its last weights (batches released untrained), and asks again every ``peer_wait_s``.
"""
from __future__ import annotations

import hashlib
import time
from typing import Any

import structlog

from rlinkd.daemon.errors import ConfigError
from rlinkd.daemon.learner.job_member import job_fingerprint, shared_settings
from rlinkd.daemon.learner.shell import LearnerShell
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import PolicyTopology, Topology

REFORM_ATTEMPTS = 3  # generations rank 0 tries in a row before its learner fails (restart)
log = structlog.get_logger("learner")


class JobShell(LearnerShell):
    """``LearnerShell`` whose policies train in the job's rounds (see the module docstring)."""

    def __init__(self, topo: Topology, ctx: RoleContext) -> None:
        self.cluster = topo.cfg.cluster
        self.job: Any = self._connect(topo)
        self.detached = False  # a rank other than 0 that lost rank 0: serves its last weights
        self.next_round = 0.0
        super().__init__(topo, ctx)

    def _make_policy(self, policy: PolicyTopology) -> Any:
        from rlinkd.daemon.learner.job_learner import JobLearner
        from rlinkd.daemon.learner.job_replay_learner import JobReplayLearner
        cls = JobReplayLearner if policy.uses_replay else JobLearner
        return cls(policy, self.topo.cfg, self.ctx, self.job)

    def _connect(self, topo: Topology) -> Any:
        """Reach the job's store (rank 0 serves it), on the first trainable policy's device;
        on a first start a failure is a ConfigError naming ``cluster.master``."""
        import torch

        from rlinkd.daemon.cluster.job import Job
        from rlinkd.daemon.learner.placement import place
        first = topo.trainable()[0]
        try:
            return Job.connect(self.cluster, torch.device(place(first.definition, topo.cfg).device))
        except (RuntimeError, ValueError) as exc:
            if _first_join(first):
                raise ConfigError(f"cluster.master = {self.cluster.master!r}: rank "
                                  f"{self.cluster.rank} could not "
                                  f"{'serve' if self.cluster.rank == 0 else 'reach'} the job's "
                                  f"rendezvous within {self.cluster.collective_timeout_s:g} s "
                                  f"({exc})") from None
            raise

    def _ordered(self) -> list[Any]:
        return [self.policies[name] for name in sorted(self.policies)]

    # ------------------------------------------------------------ membership
    def _after_policies_booted(self) -> None:
        """Enter the job (rank 0 waits up to the collective timeout for every rank the
        first time)."""
        self._enter(self.cluster.collective_timeout_s)

    def _enter(self, window_s: float) -> None:
        """Form the next generation's group, check it trains the same policies, give every
        policy the newest member's state and sequence number, publish."""
        self._check_device_kinds()  # (local: before the group, which would wait for us)
        self.job.enter(window_s, self.ctx.heartbeat)
        while refused := self._check_same_job():  # (they leave: form the group again without
            self.job.leave_group()                 # them, waiting for the members that agreed)
            self.job.members = [m for m in self.job.members if m not in refused]
            self.job.enter(window_s, self.ctx.heartbeat)
        sources = {learner.name: learner.join_job() for learner in self._ordered()}
        self.detached = False
        log.info("joined_job", rank=self.cluster.rank, generation=self.job.generation,
                 members=self.job.members, state_from_rank=sources)

    def _check_device_kinds(self) -> None:
        """ConfigError unless every trainable policy learns on the job's kind of device (a
        gradient is averaged on its policy's device)."""
        import torch
        kinds = sorted({torch.device(p.placement.device).type for p in self._ordered()})
        if kinds != [self.job.device.type]:
            self.job.close()
            raise ConfigError(f"learner.device: the trainable policies of a job must all learn on "
                              f"the job's device kind ({self.job.device.type}); here they learn on "
                              f"{', '.join(kinds)}")

    def _check_same_job(self) -> list[int]:
        """One gather of every member's trainable policies, spaces, networks and shared
        settings. A member whose differ from rank 0's raises ConfigError (exit 78: its config
        must change); the others log it and return the ranks that differ (they leave the
        group: form it again without them); [] when all agree. Rank 0's config is the job's."""
        ordered = self._ordered()
        mine = hashlib.sha256(repr([(p.name, job_fingerprint(p.policy)) for p in ordered]).encode())
        prints = self.job.gather(int.from_bytes(mine.digest()[:7], "big"))
        odd = [self.job.members[i] for i, p in enumerate(prints) if p != prints[0]]
        if not odd:
            return []
        keys = sorted({f"{section}.{'/'.join(settings)}"
                       for section, settings in (shared_settings(p.policy) for p in ordered)})
        what = (f"train different trainable policies, spaces, networks, learner.algorithm or "
                f"{', '.join(keys)}: every rank's config must agree with rank 0's")
        if self.cluster.rank in odd:
            self.job.close()
            others = [m for m in self.job.members if m not in odd]
            raise ConfigError(f"cluster.world_size: rank {self.cluster.rank} and rank(s) {others} {what}")
        log.error("job_member_refused", rank=self.cluster.rank, refused=odd, why=what)
        return odd

    def _reform(self, reason: str) -> None:
        """Re-form after a lost member or for a newcomer. A rank that cannot reach rank 0's
        store any more detaches: it serves its last weights and asks again every
        ``peer_wait_s``. Rank 0 tries the next generation when one fails (a rank whose wish
        it admitted never came: it gave up waiting or restarted, and asks for a later one),
        up to REFORM_ATTEMPTS generations in a row."""
        log.warning("job_reforming", rank=self.cluster.rank, reason=reason,
                    generation=self.job.generation, members=self.job.members)
        if self.cluster.rank == 0:
            return self._reform_as_rank_0()
        try:
            self._enter(self.cluster.reform_window_s)
        except RuntimeError as exc:
            self.job.leave_group()
            self.job.members = []
            if not self.detached:
                log.warning("job_detached", rank=self.cluster.rank,
                            error=str(exc).splitlines()[0] if str(exc) else "")
            self.detached = True

    def _reform_as_rank_0(self) -> None:
        for attempt in range(1, REFORM_ATTEMPTS + 1):
            try:
                return self._enter(self.cluster.reform_window_s)
            except RuntimeError as exc:
                if attempt == REFORM_ATTEMPTS or self.ctx.stop.is_set():
                    raise
                self.job.leave_group()
                self.job.members = [0]  # (only the ranks that ask now: no stale wish again)
                log.warning("job_generation_failed", generation=self.job.generation, attempt=attempt,
                            error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    def _rejoin(self) -> None:
        try:
            self.job.reconnect(timeout_s=min(1.0, self.cluster.peer_wait_s * 2))
        except RuntimeError:
            return
        self._reform("rank 0 reachable again")

    # ------------------------------------------------------------ rounds
    def train_one(self) -> bool:
        """Enter the job's next round when some policy has work, or with none once
        ``peer_wait_s`` has passed since this rank's last round; True if any policy had
        work. Detached, batches are released untrained (clients go on with the last weights)."""
        if self.ctx.stop.is_set():
            return False
        entries = [(learner, learner.round_entry()) for learner in self._ordered()]
        wanted = any(learner.round_wanted(entry) for learner, entry in entries)
        if not wanted and time.monotonic() < self.next_round:
            for learner, _ in entries:
                learner.between_rounds()
            return False
        self.next_round = time.monotonic() + self.cluster.peer_wait_s
        if self.detached:
            for learner, entry in entries:
                learner.release_untrained(entry)
            self._rejoin()
            return wanted
        self.job.reform_wanted = self.cluster.rank == 0 and self.job.newcomers_waiting()
        return self._round(entries) or wanted

    def _round(self, entries: list[tuple[Any, Any]]) -> bool:
        """Every policy's part of one round, in order; True if any trained."""
        trained, done = False, 0
        try:
            for learner, entry in entries:
                trained = learner.run_round(entry) or trained
                done += 1
        except RuntimeError as exc:  # a member is gone (its sockets closed, or the timeout)
            for learner, entry in entries[done:]:
                learner.release_untrained(entry)
            self._reform(f"collective failed: {str(exc).splitlines()[0] if str(exc) else exc!r}")
            return True
        if self.job.reform_agreed:
            self.job.reform_agreed = False
            self._reform("a rank asks to join")
        return trained

    def close(self) -> None:
        super().close()
        self.job.close()


def _first_join(policy: PolicyTopology) -> bool:
    """No weights published yet on this daemon: its first start (not a learner restart)."""
    from rlinkd.shm.board import WeightsBoard
    board = WeightsBoard.attach(policy.board_path)
    try:
        return board.latest_seq_no() < 0
    finally:
        board.close()
