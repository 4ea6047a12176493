"""A replay (DQN or SAC) policy's learner as one rank of a job of several daemons
([cluster] world_size > 1): the thin shell around ``replay_job_core``.

Replay is per rank: each rank's connector fills its own buffer from its own clients, and the
rank samples it for every gradient step of the job (``replay_job_core``: row-weighted
gradients, the same weights everywhere). Its part of the job's rounds (``job_shell``):
it wants a round as soon as its own data makes gradient steps due (``updates_per_step`` per
transition received since its buffer reached ``learning_starts_steps``, less the steps it
has sampled for). The round's first collective agrees the steps: the
most any rank has due, at most up to the next publication; a rank below its learning start
joins them with no rows, so it never stalls the others (they wait for it at most
``peer_wait_s`` per round). Every ``publish_interval_updates`` steps of the job every rank
bumps ``weights_seq_no`` and publishes: the same sequence number and weights on every rank.

A rank that lost rank 0 trains nothing and serves its last weights while it asks again.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from rlinkd.daemon import messages as m
from rlinkd.daemon.config import Config
from rlinkd.daemon.learner.job_member import JobMember, weights_digest
from rlinkd.daemon.learner.replay_learner import ReplayLearner
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import PolicyTopology


class JobReplayLearner(JobMember, ReplayLearner):
    """A ``ReplayLearner`` whose gradient steps are the job's (see the module docstring)."""

    def __init__(self, policy: PolicyTopology, cfg: Config, ctx: RoleContext, job: Any) -> None:
        self.cluster = cfg.cluster
        self._join_state(job)
        super().__init__(policy, cfg, ctx)
        self.rng = np.random.default_rng((cfg.learner.seed, 2, self.cluster.rank))  # (own draws)
        self.received = 0     # transitions written since the last round (the job's env_steps)
        self.sampled_for = 0  # the job's steps this rank sampled rows for

    def _make_core(self, policy: PolicyTopology, cfg: Config) -> Any:
        """The core, built with the job (joined by ``job_shell`` after boot)."""
        from rlinkd.daemon.learner.replay_job_core import JobDQNLearner, JobSACLearner
        core = JobSACLearner if self.algorithm == "sac" else JobDQNLearner
        return core(policy.spec, self.hp, self.job, device=self.placement.device,
                    seed=cfg.learner.seed + self.cluster.rank, torch_threads=cfg.learner.torch_threads)

    def _job_core(self) -> Any:
        return self.core

    def _announce(self) -> None:
        self._publish(None)

    def _publish(self, update: m.TrainStats | None) -> None:
        super()._publish(update)
        self.digest = weights_digest(self.core.flat_weights())

    # ------------------------------------------------------------ rounds (job_shell)
    def round_entry(self) -> int:
        """This policy's entry into the next round: the steps its replay makes due."""
        return self._due_steps()

    @staticmethod
    def round_wanted(due: int) -> bool:
        return due >= 1

    def run_round(self, due: int) -> bool:
        """This policy's steps in the round; True if the job stepped."""
        return self._round(due)

    def release_untrained(self, due: int) -> None:
        """Nothing: replay leaves no batch behind."""

    def between_rounds(self) -> None:
        self._maybe_report()

    def _received(self, transitions: int) -> None:
        """New transitions here: counted by the job at the next round's exchange."""
        self.received += transitions

    def _steps_done(self) -> int:
        """The job's steps this rank sampled rows for (its own data's share)."""
        return self.sampled_for

    def _round(self, due: int) -> bool:
        """One round of the job; publish when the job's update count reaches the interval."""
        ready = self.start is not None
        started, collective_start = time.perf_counter(), self.job.collective_s
        steps = self.core.round(due, self.hp.batch_size if ready else 0, self.received,
                                self._sample, lambda: self._stepped(ready), self._counted)
        if not steps:
            return False
        self.pending.extend(steps)
        self.pending_s += time.perf_counter() - started
        self.collective_s = self.job.collective_s - collective_start
        self.rows_per_rank = self._by_daemon_rank(list(self.core.rows_per_rank))
        if self.core.updates % self.hp.publish_interval_updates == 0:
            self._publish(self._summary())
        return True

    def _counted(self) -> None:
        """The round's exchange counted the transitions received so far."""
        self.received = 0

    def _stepped(self, sampled: bool) -> None:
        """After each step a round runs (counted as it runs: a round that fails midway
        leaves only the steps it ran counted)."""
        self.ctx.heartbeat()
        self.sampled_for += int(sampled)

    def _sample(self) -> np.ndarray:
        rows = self.replay.sample(self.hp.batch_size, self.rng)
        assert rows is not None  # (a rank samples only once its buffer reached its learning start)
        return rows
