"""Tier 1: the learner's step is ready for a GPU without one: static minibatch shapes (and
their remainder rule), no host synchronisation inside an epoch (counted), reloadable
hyperparameters held as device tensors that a reload copies into, a skipped non-finite step."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rlinkd.daemon.learner.learner import Learner
from rlinkd.daemon.learner.minibatch import epoch_plan, update_plan
from tests.unit.test_learner_update import BOX, CARTPOLE, HP, make_batch

SYNCS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")
"""Tensor methods that read a value back to the host (on a GPU: wait for the device)."""


@pytest.mark.parametrize("n, b, expected_shape", [(512, 64, (8, 64)), (500, 128, (4, 128)),
                                                  (100, 128, (1, 100)), (129, 128, (2, 128))])
def test_every_minibatch_has_the_same_rows_and_the_remainder_refills_from_the_shuffle(
        n, b, expected_shape):
    perm = np.random.default_rng(0).permutation(n)
    plan = epoch_plan(perm, b)
    assert plan.shape == expected_shape
    counts = np.bincount(plan.reshape(-1), minlength=n)
    assert counts.min() == 1  # every row at least once per epoch
    extra = plan.size - n      # the remainder rule: the first rows of the shuffle, once more
    assert extra < b and sorted(np.flatnonzero(counts == 2)) == sorted(perm[:extra])
    assert np.array_equal(plan.reshape(-1)[:n], perm)


def test_the_update_plan_is_a_fresh_shuffle_per_epoch():
    plan = update_plan(np.random.default_rng(1), 300, 64, 3)
    assert plan.shape == (3, 5, 64) and plan.dtype == np.int64
    assert not np.array_equal(plan[0], plan[1])


def test_an_update_trains_static_minibatches(monkeypatch):
    learner = Learner(CARTPOLE, HP(minibatch_size=96, num_epochs=2), device="cpu")
    shapes = []
    step = learner._sgd_step
    monkeypatch.setattr(learner, "_sgd_step", lambda data, idx: shapes.append(idx.shape) or step(data, idx))
    learner.update(make_batch(CARTPOLE, learner, n=500))
    assert shapes == [torch.Size([96])] * (2 * 6)  # ceil(500 / 96) = 6 per epoch


class SyncCounter:
    """Counts the host reads of tensor values while ``inside`` is set."""

    def __init__(self, monkeypatch) -> None:
        self.inside, self.count = False, 0
        for name in SYNCS:
            real = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(real))

    def _counting(self, real):
        def method(tensor, *args, **kwargs):
            self.count += self.inside
            return real(tensor, *args, **kwargs)
        return method


def epoch_syncs(monkeypatch, learner, batch) -> tuple[int, int]:
    """(host reads during the epochs, epochs run) of one update."""
    counter, epochs = SyncCounter(monkeypatch), learner._epochs

    def counted(*args):
        counter.inside = True
        try:
            return epochs(*args)
        finally:
            counter.inside = False
    monkeypatch.setattr(learner, "_epochs", counted)
    stats = learner.update(batch)
    return counter.count, int(stats["epochs"])


@pytest.mark.parametrize("spec", [CARTPOLE, BOX])
def test_no_host_read_inside_an_epoch(monkeypatch, spec):
    learner = Learner(spec, HP(num_epochs=3, target_kl=0.0), device="cpu")
    assert epoch_syncs(monkeypatch, learner, make_batch(spec, learner)) == (0, 3)


def test_target_kl_reads_the_device_once_per_epoch(monkeypatch):
    learner = Learner(CARTPOLE, HP(num_epochs=4, target_kl=1e9), device="cpu")
    syncs, epochs = epoch_syncs(monkeypatch, learner, make_batch(CARTPOLE, learner))
    assert epochs == 4 and syncs == 4


def test_a_reload_copies_into_the_device_tensors_the_step_reads():
    learner = Learner(CARTPOLE, HP(lr=3e-4, ent_coef=0.0), device="cpu")
    lr_t, ent_t = learner.optimizer.lr_t, learner.ent_coef_t
    before = (lr_t.data_ptr(), ent_t.data_ptr(), learner.optimizer.flat.data_ptr())
    learner.set_hparams(lr=0.0, ent_coef=0.25)
    assert learner.optimizer.lr_t is lr_t and learner.ent_coef_t is ent_t
    assert (lr_t.data_ptr(), ent_t.data_ptr(), learner.optimizer.flat.data_ptr()) == before
    assert (float(lr_t), float(ent_t)) == (0.0, 0.25)
    weights = learner.flat_weights()
    learner.update(make_batch(CARTPOLE, learner))  # lr 0: the step reads the new value
    np.testing.assert_array_equal(learner.flat_weights(), weights)
    learner.set_hparams(lr=1e-3)
    learner.update(make_batch(CARTPOLE, learner))
    assert not np.array_equal(learner.flat_weights(), weights)
    # and the step read the reloaded ent_coef: as a learner that had it from the start
    np.testing.assert_array_equal(learner.flat_weights(), reloaded_lr_run(0.25))
    assert not np.array_equal(learner.flat_weights(), reloaded_lr_run(0.0))  # it matters


def reloaded_lr_run(ent_coef: float) -> np.ndarray:
    """The weights after an update at lr 0 and one at a reloaded lr 1e-3, ent_coef fixed."""
    learner = Learner(CARTPOLE, HP(lr=0.0, ent_coef=ent_coef), device="cpu")
    learner.update(make_batch(CARTPOLE, learner))
    learner.set_hparams(lr=1e-3)
    learner.update(make_batch(CARTPOLE, learner))
    return learner.flat_weights()


def test_a_non_finite_step_is_skipped_on_the_device():
    learner = Learner(CARTPOLE, HP(), device="cpu")
    batch = make_batch(CARTPOLE, learner)
    data = learner._to_tensors(batch)
    data["advantages"] = torch.full_like(data["advantages"], float("inf"))  # past the checks
    weights, m = learner.flat_weights(), learner.optimizer.m.clone()
    diag = learner._sgd_step(data, torch.arange(64))
    assert diag[-1] == 0.0 and diag[-2] == 0.0  # not applied, no grad norm counted
    np.testing.assert_array_equal(learner.flat_weights(), weights)
    assert torch.equal(learner.optimizer.m, m) and learner.optimizer.step_count == 0
    data = learner._to_tensors(batch)
    assert learner._sgd_step(data, torch.arange(64))[-1] == 1.0
    assert learner.optimizer.step_count == 1 and not np.array_equal(learner.flat_weights(), weights)
