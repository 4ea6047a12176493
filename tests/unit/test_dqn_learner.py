"""learner.dqn_learner: one gradient step moves Q(s, a) toward its target, the target network
follows on schedule, the epsilon clock, an exact resume from state_dict(), and the uniform
weight initialisation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.config import ConfigError, DQNConfig, load_config
from rlinkd.daemon.learner.dqn_learner import DQNLearner
from rlinkd.shm.records import StepLayout
from rlinkd.shm.replay import ReplayLayout

SPEC = PolicySpec(Box((4,), low=-5.0, high=5.0), Discrete(3), hidden_sizes=(16,), activation="relu")
LAYOUT = ReplayLayout(StepLayout.flat(4, 1, 3))


def rows(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = LAYOUT.empty(n)
    out["obs"]["obs"] = rng.uniform(-1, 1, (n, 4))
    out["next_obs"]["obs"] = rng.uniform(-1, 1, (n, 4))
    out["action"][:, 0] = rng.integers(0, 3, n)
    out["reward"], out["discount"] = rng.uniform(0, 1, n), np.where(rng.random(n) < 0.2, 0.0, 0.99)
    return out


def learner(**hp) -> DQNLearner:
    return DQNLearner(SPEC, DQNConfig(**{"lr": 1e-2, "target_update_interval_updates": 3, **hp}),
                      device="cpu", seed=0)


def test_steps_reduce_the_td_error_and_the_target_follows_every_interval():
    lr, batch = learner(), rows(32, 0)
    first = lr.train_step(batch)
    assert set(first) == {"loss", "q_mean", "td_abs_mean", "grad_norm"}
    target_before = lr.target.flat_weights()
    lr.train_step(batch)
    assert np.array_equal(lr.target.flat_weights(), target_before)  # 2 updates: not yet
    lr.train_step(batch)                                              # the 3rd: copied
    assert np.array_equal(lr.target.flat_weights(), lr.model.flat_weights())
    assert lr.updates == 3 and lr.trained_steps == 3 * 32
    fixed = learner(target_update_interval_updates=10_000)  # a fixed target: TD error falls
    first = fixed.train_step(batch)
    for _ in range(50):
        last = fixed.train_step(batch)
    assert last["td_abs_mean"] < 0.5 * first["td_abs_mean"]


def test_epsilon_follows_the_env_steps_received():
    lr = learner(epsilon_start=1.0, epsilon_end=0.1, epsilon_decay_steps=100)
    assert lr.epsilon == 1.0
    lr.env_steps = 50
    assert lr.epsilon == pytest.approx(0.55) and lr.live_hparams()["epsilon"] == pytest.approx(0.55)


def test_state_dict_resumes_exactly():
    a = learner()
    for i in range(5):
        a.train_step(rows(16, i))
    a.env_steps = 1234
    state = a.state_dict()
    b = learner(lr=0.5)  # the config's lr is kept, the saved one reported
    assert b.load_state_dict(state)["lr"] == pytest.approx(1e-2)
    assert b.hp.lr == 0.5 and b.optimizer.param_groups[0]["lr"] == 0.5
    b.set_hparams(lr=1e-2)
    for i in range(5, 9):
        a.train_step(rows(16, i))
        b.train_step(rows(16, i))
    assert np.array_equal(a.flat_weights(), b.flat_weights())
    assert np.array_equal(a.target.flat_weights(), b.target.flat_weights())
    assert (a.updates, a.env_steps, a.epsilon) == (b.updates, b.env_steps, b.epsilon)
    with pytest.raises(ValueError, match="not a DQN"):
        b.load_state_dict({"format_version": 2})
    with pytest.raises(ValueError):
        b.set_hparams(lr=-1.0)


def test_uniform_weight_init_redraws_the_q_path_only_and_the_target_starts_equal():
    ortho, uniform = learner(), learner(weight_init="uniform")
    for name in ("pi.0.weight", "pi.0.bias", "pi.1.weight", "pi.1.bias"):
        w = uniform.model.tensor(name)
        fan_in = {"pi.0": 4, "pi.1": 16}[name[:4]]
        assert w.abs().max() <= 1 / fan_in ** 0.5 and not torch.equal(w, ortho.model.tensor(name))
    assert uniform.model.tensor("pi.1.bias").abs().min() > 0  # biases drawn too, not zeros
    for name in ("vf.0.weight", "obs_std"):  # the unused critic trunk and the normaliser stay
        assert torch.equal(uniform.model.tensor(name), ortho.model.tensor(name))
    assert np.array_equal(uniform.target.flat_weights(), uniform.flat_weights())
    assert np.array_equal(uniform.flat_weights(), learner(weight_init="uniform").flat_weights())
    q = uniform.model.dist_inputs(torch.from_numpy(rows(32, 0)["obs"]["obs"]))
    assert q.abs().mean() > 10 * ortho.model.dist_inputs(torch.from_numpy(rows(32, 0)["obs"]["obs"])).abs().mean()
    assert load_config(overrides=[("dqn", "weight_init", "uniform")], resolve_dirs=False).dqn.weight_init == "uniform"
    with pytest.raises(ConfigError, match="weight_init"):
        load_config(overrides=[("dqn", "weight_init", "xavier")], resolve_dirs=False)


def test_the_learning_rate_decays_with_the_env_steps_received():
    """dqn.lr_decay_steps: lr falls linearly to lr_end over that many env steps, each step
    uses the rate of its moment (an exact resume needs nothing more than env_steps)."""
    dqn = learner(lr=1e-2, lr_end=1e-3, lr_decay_steps=100)
    assert dqn.lr == pytest.approx(1e-2)
    dqn.env_steps = 50
    dqn.train_step(rows(8, 0))
    assert dqn.optimizer.param_groups[0]["lr"] == pytest.approx(5.5e-3)
    assert dqn.live_hparams()["lr"] == pytest.approx(5.5e-3)
    dqn.env_steps = 10_000
    assert dqn.lr == pytest.approx(1e-3)
    assert learner(lr=1e-2).lr == 1e-2  # (no decay by default)


def test_a_step_reads_nothing_back_until_its_stats_are_looked_at(monkeypatch):
    from tests.unit.test_learner_step import SyncCounter
    lr, batch = learner(), rows(32, 0)
    counter = SyncCounter(monkeypatch)
    counter.inside = True
    stats = [lr.train_step(batch) for _ in range(5)]
    assert counter.count == 0
    assert stats[0]["loss"] > 0 and counter.count == 1  # read once, when first looked at
    assert set(stats[-1]) == {"loss", "q_mean", "td_abs_mean", "grad_norm"} and counter.count == 1


def test_a_non_finite_step_is_skipped(monkeypatch):
    lr, batch = learner(), rows(32, 0)
    batch["reward"][:] = np.inf
    weights = lr.model.flat_weights()
    stats = lr.train_step(batch)
    assert not np.isfinite(stats["loss"]) and lr.optimizer.step_count == 0
    np.testing.assert_array_equal(lr.model.flat_weights(), weights)


def test_a_publication_reads_its_steps_stats_in_one_go(monkeypatch):
    from rlinkd.daemon.learner.learner import mean_stats
    from tests.unit.test_learner_step import SyncCounter
    lr = learner()
    stats = [lr.train_step(rows(32, i)) for i in range(5)]
    counter = SyncCounter(monkeypatch)
    counter.inside = True
    means = mean_stats(stats)
    assert counter.count == 1
    expected = {k: np.mean([dict(s)[k] for s in stats]) for k in stats[0]}
    assert means == pytest.approx(expected, rel=1e-6)
