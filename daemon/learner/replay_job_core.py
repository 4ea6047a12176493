"""The DQN and SAC learner cores as one rank of a data-parallel job (``daemon.cluster``).

Replay is per rank: every rank samples its own buffer, at its ``batch_size``, for every
gradient step of the job; a rank whose buffer is below its learning start samples nothing
and joins the step with 0 rows. Each network's gradient is averaged across the ranks,
weighted by their rows, by one all-reduce (``Job.average``; its diagnostics ride along) before
it is clipped and applied: DQN one per step, SAC three (critics, actor, alpha, in the order
one learner steps them: the actor's loss reads the critics just stepped). Every loss is a
mean over rows, so the job's step is one learner's step on the union of the ranks' samples.
The rest of a step acts on state that is the same on every rank and so stays the same: the
target network's copy (DQN, every ``target_update_interval_updates`` of the job's shared
update count), the Polyak update of the target critics and log alpha's step (SAC).

A round (``round``) agrees the number of steps: one all-reduce exchanges each rank's steps due
by its own data (``updates_per_step`` per transition since its learning start, less the
steps it has sampled for), its rows per step and the transitions it received since the last
round; the job runs ``steps.replay_steps`` (the most due, at most up to the next
publication), and every rank's ``env_steps`` advances by the job's transitions, so the
epsilon and learning-rate schedules are the job's and the same on every rank.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from rlinkd.daemon.cluster.job import Job
from rlinkd.daemon.cluster.steps import replay_steps
from rlinkd.daemon.learner.adam import Adam
from rlinkd.daemon.learner.dqn import DQN_STATS
from rlinkd.daemon.learner.dqn_learner import STEP_STATS, DQNLearner
from rlinkd.daemon.learner.learner import DeviceStats
from rlinkd.daemon.learner.sac import ACTOR_STATS, CRITIC_STATS, polyak_update
from rlinkd.daemon.learner.sac_learner import SAC_STATS, SACLearner, step_stats

Sample = Callable[[], np.ndarray]


class ReplayJobRank:
    """The job's part of a replay core (mixed in before ``DQNLearner`` / ``SACLearner``)."""

    job: Job
    hp: Any
    device: torch.device
    updates: int
    trained_steps: int
    env_steps: int
    rows_now = 0                     # this rank's rows in the step being run
    rows_per_rank: tuple[int, ...] = ()  # rows each member sampled in the last round

    def _descend(self, optimizer: Adam, loss: torch.Tensor | None, stats: torch.Tensor,
                 max_norm: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The job's step of one network: this rank's gradient (none without a loss) and
        ``stats`` averaged across the ranks by one all-reduce, then clipped and applied
        (gated off everywhere when any rank's loss was not finite)."""
        optimizer.zero_grad()
        finite = torch.ones((), device=self.device)
        if loss is not None:
            loss.backward()
            finite = torch.isfinite(loss.detach())
        gate = self.job.average(optimizer.grad, stats, float(self.rows_now), finite)
        norm, clip_gate = optimizer.clip_grad_norm_(max_norm)
        optimizer.step(clip_gate * gate)
        return norm, stats

    def round(self, due: int, batch_size: int, received: int, sample: Sample,
              on_step: Callable[[], None], on_counted: Callable[[], None] = lambda: None
              ) -> list[Mapping[str, float]]:
        """One round of the job (see the module docstring): `due` steps by this rank's data,
        `batch_size` rows per step (0: nothing to sample yet), `received` transitions since
        the last round; `sample()` draws this rank's rows for a step, `on_step()` follows
        each step run, `on_counted()` the exchange that counted `received` (a round that
        fails after it must not count them again). The steps' statistics (the job's means),
        [] when the job had no step to run."""
        interval = self.hp.publish_interval_updates
        counts = self.job.exchange([due, batch_size, received], (float(self.hp.lr), 0.0))
        if self.job.leader_hparams[0] != self.hp.lr:  # rank 0's reload governs the job
            self.set_hparams(lr=self.job.leader_hparams[0])
        self.env_steps += int(sum(c[2] for c in counts))
        on_counted()
        rows = [int(c[1]) for c in counts]
        steps = replay_steps([int(c[0]) for c in counts], rows, interval - self.updates % interval)
        trained, out = self.trained_steps, []
        for _ in range(steps):
            out.append(self.job_step(sample() if batch_size else None))
            on_step()
        self.trained_steps = trained + steps * sum(rows)
        self.rows_per_rank = tuple(steps * r for r in rows)
        return out

    def job_step(self, rows: np.ndarray | None) -> Mapping[str, float]:
        """One gradient step of the job on this rank's sample `rows` (None: no rows; the
        job's averaged step is applied all the same)."""
        self.rows_now = 0 if rows is None else len(rows)
        if rows is not None:
            return self.train_step(rows)
        stats = DeviceStats(self.step_names, self._idle_step())
        self._count_step(0)
        return stats

    def take_job_state(self, source: int = 0) -> None:
        """Member `source`'s training state onto this rank (every member calls it on joining):
        every network, optimizer moments and step counts, the counters (the hyperparameters
        stay each rank's config; the noise and sampling generators stay each rank's own)."""
        counters = torch.tensor([self.updates, self.trained_steps, self.env_steps], dtype=torch.int64)
        self.job.broadcast_([*self._job_tensors(), counters], source)
        self.updates, self.trained_steps, self.env_steps = (int(v) for v in counters.tolist())

    def _job_tensors(self) -> list[torch.Tensor]:
        modules, optimizers = self._job_parts()
        return ([t for module in modules for t in module.state_dict().values()]
                + [t for o in optimizers for t in (o.flat, o.m, o.v, o.step_t)])

    # provided by the core the mixin is put before (and its Job* class)
    step_names: tuple[str, ...]
    set_hparams: Callable[..., None]
    train_step: Callable[[np.ndarray], Mapping[str, float]]
    _idle_step: Callable[[], torch.Tensor]
    _count_step: Callable[[int], None]
    _job_parts: Callable[[], tuple[list[torch.nn.Module], list[Adam]]]


class JobDQNLearner(ReplayJobRank, DQNLearner):
    """``DQNLearner`` as one rank of a job; `job` joined already. Steps run eagerly (no graph
    holds the collective)."""

    step_names = STEP_STATS

    def __init__(self, spec: Any, hp: Any, job: Job, device: str = "auto", seed: int = 0,
                 torch_threads: int = 0) -> None:
        self.job = job
        super().__init__(spec, hp, device=device, seed=seed, torch_threads=torch_threads, graphs=False)

    def _idle_step(self) -> torch.Tensor:
        self.optimizer.param_groups[0]["lr"] = self.lr
        norm, stats = self._descend(self.optimizer, None, torch.zeros(len(DQN_STATS), device=self.device),
                                    self.hp.max_grad_norm)
        return torch.cat([stats, norm.reshape(1)])

    def _job_parts(self) -> tuple[list[torch.nn.Module], list[Adam]]:
        return [self.model, self.target], [self.optimizer]


class JobSACLearner(ReplayJobRank, SACLearner):
    """``SACLearner`` as one rank of a job; `job` joined already. Steps run eagerly."""

    step_names = SAC_STATS

    def __init__(self, spec: Any, hp: Any, job: Job, device: str = "auto", seed: int = 0,
                 torch_threads: int = 0) -> None:
        self.job = job
        super().__init__(spec, hp, device=device, seed=seed, torch_threads=torch_threads, graphs=False)

    def _idle_step(self) -> torch.Tensor:
        """The job's step without rows of this rank: the same three averaged steps and the
        Polyak update, in the same order as ``_sgd_step``."""
        alpha = self.log_alpha.detach().exp()
        zeros = torch.zeros(len(CRITIC_STATS) + len(ACTOR_STATS), device=self.device)
        grad_norm, critic_stats = self._step(self.critic_opt, None, zeros[:len(CRITIC_STATS)])
        _, actor_stats = self._step(self.actor_opt, None, zeros[len(CRITIC_STATS):])
        if self.alpha_opt is not None:
            self._step(self.alpha_opt, None)
        polyak_update(*self._polyak_pairs, self.hp.tau)
        return step_stats(critic_stats, grad_norm, actor_stats, alpha)

    def _job_parts(self) -> tuple[list[torch.nn.Module], list[Adam]]:
        return [self.model, *self.critics, *self.targets], self._optimizers()
