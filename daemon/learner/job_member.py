"""A trainable policy's learner as a member of a job of several daemons: what every
algorithm's job learner shares (``job_learner.JobLearner`` for PPO/APPO batches,
``job_replay_learner.JobReplayLearner`` for DQN/SAC replay). The job itself (membership,
rounds, faults) is the learner process's, ``job_shell.JobShell``; a policy's part is to take
the newest member's state when the group forms (``join_job``), to run its part of a round,
and to report the cluster in its status.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from rlinkd.daemon import messages as m
from rlinkd.daemon.config import ClusterConfig
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import PolicyTopology

SHARED_SETTINGS = {
    "ppo": ("minibatch_size", "num_epochs", "target_kl", "normalize_observations", "max_grad_norm",
            "gamma", "gae_lambda", "clip_coef", "vf_coef", "clip_vloss", "normalize_advantages"),
    "appo": ("vtrace_rho_clip", "vtrace_c_clip"),
    "replay": ("gamma", "n_step", "publish_interval_updates", "target_update_interval_updates",
               "max_grad_norm", "double_q", "lr_end", "lr_decay_steps", "epsilon_start",
               "epsilon_end", "epsilon_decay_steps", "tau", "initial_alpha", "autotune_alpha",
               "target_entropy_per_dim")}
"""Per kind of learner, the keys of its section ([ppo], or [dqn]/[sac] where the key exists)
every rank must share: they decide the collectives an update runs, the loss whose gradient
is averaged, how the averaged gradient is applied, or the schedules every rank steps by
(advantages are still normalised per rank, on its own batch). The others ([dqn]/[sac] batch_size,
updates_per_step, learning_starts_steps, buffer_size_steps) are each rank's: its replay."""


def joined_seq_no(seq_nos: list[int], prints: list[int], source: int, changed: bool = False) -> int:
    """The sequence number a newly formed group publishes member ``source``'s weights
    under: the newest, or one past it when a member published other weights (``prints``
    differ) under that same number, or the source's weights changed since it published
    them (``changed``: steps of a cut replay round stay applied)."""
    top = max(seq_nos)
    clash = changed or any(s == top and p != prints[source] for s, p in zip(seq_nos, prints))
    return top + 1 if clash else top


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
    shared = {k: getattr(definition.ppo, k) for k in SHARED_SETTINGS["ppo"]}
    if definition.algorithm == "appo":
        shared |= {f"appo.{k}": getattr(definition.appo, k) for k in SHARED_SETTINGS["appo"]}
    return "ppo", shared


def job_fingerprint(policy: PolicyTopology) -> int:
    """A 56-bit digest of what every rank must share: spaces and network, algorithm, and
    ``shared_settings``."""
    shared = {"spec": policy.spec.to_json(), "algorithm": policy.definition.algorithm,
              **shared_settings(policy)[1]}
    digest = hashlib.sha256(json.dumps(shared, sort_keys=True, default=str).encode()).digest()
    return int.from_bytes(digest[:7], "big")


def newest_member(seq_nos: list[int], updates: list[int]) -> int:
    """The member (group index) whose state a newly formed group takes: the highest weights
    sequence number, then the most gradient steps run, then the first."""
    return max(range(len(seq_nos)), key=lambda i: (seq_nos[i], updates[i], -i))


class JobMember:
    """A policy's part of the job, mixed in before ``PolicyLearner`` or ``ReplayLearner``.
    The host provides ``_job_core()`` (whose ``take_job_state(source)`` hands a member's
    training state to the others), ``_announce()`` (publish the weights, tell the
    collector) and its part of a round (``round_entry``, ``round_wanted``, ``run_round``,
    ``release_untrained``, ``between_rounds``: see ``job_shell``)."""

    policy: PolicyTopology
    ctx: RoleContext
    name: str
    seq_no: int
    cluster: ClusterConfig
    job: Any
    collective_s: float
    rows_per_rank: list[int]
    digest: str
    _job_core: Callable[[], Any]  # (provided by the host, as the fields above)
    _announce: Callable[[], None]

    def _join_state(self, job: Any) -> None:
        """The job's fields, before the core is built (with ``job``, already connected)."""
        self.job = job
        self.rows_per_rank, self.collective_s, self.digest = [], 0.0, ""

    def join_job(self) -> int:
        """In a newly formed group: take the state and sequence number of the member with
        the newest weights, publish; that member's daemon rank. On a tie, the member that
        has run the most gradient steps: a learner restarted from the weights board has
        those weights but fresh optimizer moments, targets and counters, and must not
        overwrite an intact copy (then the first such). The sequence number is one past the
        newest when another member published different weights under it (each rank's first
        weights, seq 0, are its own random ones) or the source's changed since it published
        them: readers keyed by the number would keep the old ones."""
        core = self._job_core()
        seq_nos, updates = self.job.gather(self.seq_no), self.job.gather(core.updates)
        now = weights_digest(core.flat_weights())
        changed = bool(self.digest) and now != self.digest  # (a cut replay round's applied steps)
        both = self.job.gather(int(now[:14], 16) << 1 | changed)  # (56 bits, then the flag)
        source = newest_member(seq_nos, updates)
        core.take_job_state(source)
        self.seq_no = joined_seq_no(seq_nos, [b >> 1 for b in both], source, bool(both[source] & 1))
        self._announce()
        return int(self.job.members[source])

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
