"""The PPO learner core as one rank of a data-parallel job (``daemon.cluster``).

``JobRankLearner`` is ``Learner`` with the job's ``update``: the ranks agree the update's
steps, every step's gradient is averaged across them by one all-reduce (``Learner``'s
``_apply_step`` calls the job), and the observation normalisers merge the union's moments.

A recurrent policy's units are chunks (``bptt``): the ranks exchange their chunk counts and
each epoch runs as many steps as the rank with the most minibatches of whole chunks has; each
rank's gradient is weighted by the real (unpadded) steps of its minibatch's chunks, the rows
its masked loss is a mean over, so the job's step is one learner's on the union of the
ranks' chunks.
``take_job_state`` hands a member's whole training state to the others.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.daemon.batch_schema import OBS
from rlinkd.daemon.cluster.job import Job
from rlinkd.daemon.cluster.steps import job_steps
from rlinkd.daemon.config import PPOConfig
from rlinkd.daemon.learner.learner import Learner, _mean_stats, _no_progress, explained_variance
from rlinkd.daemon.learner.minibatch import update_plan


class JobRankLearner(Learner):
    """A ``Learner`` whose updates are a job's; `job` joined already (its group formed)."""

    job: Job

    def __init__(self, spec: PolicySpec, hp: PPOConfig, job: Job, device: str = "auto",
                 seed: int = 0, torch_threads: int = 0) -> None:
        super().__init__(spec, hp, device=device, seed=seed, torch_threads=torch_threads,
                         graphs=False, job=job)

    def update(self, batch: dict[str, np.ndarray] | None,
               on_step: Callable[[], None] = _no_progress) -> dict[str, Any]:
        """`Learner.update` as one rank of a job, in lockstep with the other ranks (the same
        collectives in the same order, see ``daemon.cluster.steps``). `batch` None: this rank
        has no rows this time. A batch this rank refuses joins as no rows (the job's update
        still counts here: stats["refused"] holds the reason, "" when none). Returns {} when
        no rank had rows; ValueError (on every rank alike) when the update went non-finite."""
        job = self.job
        start, collective_start = time.perf_counter(), job.collective_s
        data, refused = None, None
        try:
            data = None if batch is None else self._to_tensors(batch)
        except ValueError as exc:
            refused = exc
        n_rows = 0 if data is None else int(data["actions"].shape[0])
        units, per_minibatch = self._plan_units(data) if data is not None else (0, self._units_per_minibatch())
        counts = job.exchange([n_rows, units], (self.hp.lr, self.hp.ent_coef))
        rows = [int(c[0]) for c in counts]
        if job.leader_hparams != (self.hp.lr, self.hp.ent_coef):  # rank 0's reload governs
            self.set_hparams(*job.leader_hparams)
        steps_per_epoch = job_steps([int(c[1]) for c in counts], per_minibatch)
        if steps_per_epoch == 0:
            return {"refused": str(refused)} if refused is not None else {}
        epochs = self.hp.num_epochs
        plan = (update_plan(self._rng, units, per_minibatch, epochs) if data is not None
                else np.zeros((epochs, 0, 0), np.int64))
        run = self.stepper.bind(data, plan.shape[-1]) if data is not None else self._no_rows
        backup = self.model.flat_weights()
        try:
            sums, steps, epochs = self._epochs(run, self._tensor(plan), on_step, steps_per_epoch)
        except RuntimeError:  # a member lost halfway: no half-trained weights stay
            self.model.load_flat(backup)
            raise
        if not np.all(np.isfinite(self.model.flat_weights())):  # (the same on every rank)
            self._restore(backup)
            raise ValueError("the update produced non-finite weights; batch rejected")
        self._fold_into_normalizers(self._obs_columns(batch[OBS]) if data is not None and batch
                                    else {k: np.zeros((0, n.size)) for k, n in self.normalizers.items()})
        self.updates += 1
        self.trained_steps += sum(rows)
        stats: dict[str, Any] = _mean_stats(sums.tolist(), steps)
        stats["explained_variance"] = (explained_variance(batch["values"], batch["value_targets"])
                                       if data is not None and batch is not None else math.nan)
        stats["refused"] = "" if refused is None else str(refused)
        stats.update(epochs=float(epochs), n_rows=float(n_rows), job_rows=float(sum(rows)),
                     rows_per_rank=rows,
                     collective_time_s=job.collective_s - collective_start)
        stats["update_time_s"] = time.perf_counter() - start
        return stats

    def take_job_state(self, source: int = 0) -> None:
        """Rank `source`'s training state onto this rank (every rank calls it once on joining,
        so a rank that (re)joins trains from the job's weights, moments, normaliser statistics
        and counters; the hyperparameters stay each rank's config)."""
        opt = self.optimizer
        counters = torch.tensor([self.updates, self.trained_steps], dtype=torch.int64)
        moments = [torch.from_numpy(np.concatenate([[n.count], n.mean, n.m2]))
                   for _, n in sorted(self.normalizers.items())]
        self.job.broadcast_([opt.flat, opt.m, opt.v, opt.step_t, counters, *moments], source)
        self.updates, self.trained_steps = (int(v) for v in counters.tolist())
        for (key, normalizer), moment in zip(sorted(self.normalizers.items()), moments):
            values = moment.numpy()
            normalizer.count, d = int(values[0]), normalizer.size
            normalizer.mean, normalizer.m2 = values[1:1 + d].copy(), values[1 + d:].copy()
            self.model.set_normalizer(key, normalizer.mean, normalizer.std)

    @staticmethod
    def _no_rows(idx: torch.Tensor) -> torch.Tensor:
        raise AssertionError("a rank without rows has no minibatch to run")
