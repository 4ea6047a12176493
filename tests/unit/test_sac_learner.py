"""learner.sac_learner: the critic is the netops network over (obs, action); SAC learns a
continuous bandit; alpha follows the entropy target; the target critics trail by tau; an exact
resume from state_dict()."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box
from rlinkd.daemon.config import SACConfig
from rlinkd.daemon.learner.sac_learner import SACLearner, critic_spec
from rlinkd.shm.records import StepLayout
from rlinkd.shm.replay import ReplayLayout

SPEC = PolicySpec(Box((2,), low=-1.0, high=1.0), Box((1,), low=-2.0, high=2.0),
                  hidden_sizes=(32, 32), activation="relu", box_dist="squashed_gaussian")
LAYOUT = ReplayLayout(StepLayout.flat(2, 1, 2))


def bandit_rows(n: int, rng: np.random.Generator) -> np.ndarray:
    """One-step episodes: the best action is 1.5 * obs[0]; reward -(a - best)^2."""
    out = LAYOUT.empty(n)
    obs = rng.uniform(-1, 1, (n, 2)).astype(np.float32)
    out["obs"]["obs"] = out["next_obs"]["obs"] = obs
    out["action"][:, 0] = rng.uniform(-2, 2, n)
    out["reward"] = -(out["action"][:, 0] - 1.5 * obs[:, 0]) ** 2
    out["discount"] = np.where(rng.random(n) < 0.5, 0.0, 0.9)  # (some bootstrap: targets move)
    return out


def learner(**hp) -> SACLearner:
    return SACLearner(SPEC, SACConfig(**{"lr": 3e-3, "batch_size": 64, **hp}), device="cpu", seed=0)


def test_the_critic_reads_the_observation_and_the_action():
    spec = critic_spec(SPEC)
    assert [leaf.key for leaf in spec.obs_space.leaves()] == ["obs", "action"]
    assert spec.obs_space.leaves()[1].space.low == (-2.0,)


def test_sac_learns_a_continuous_bandit():
    lr, rng = learner(), np.random.default_rng(0)
    for _ in range(500):
        info = lr.train_step(bandit_rows(64, rng))
    assert set(info) >= {"loss", "critic_loss", "actor_loss", "entropy", "alpha", "q_mean", "grad_norm"}
    obs = np.array([[0.8, 0.0], [-0.8, 0.0], [0.2, 0.5]], np.float32)
    greedy = SPEC.greedy_actions(SPEC.actor_forward(lr.flat_weights(), obs))[:, 0]
    np.testing.assert_allclose(greedy, 1.5 * obs[:, 0], atol=0.3)


def test_alpha_is_tuned_toward_the_target_entropy_and_fixed_without_tuning():
    rng = np.random.default_rng(1)
    tuned, fixed = learner(), learner(autotune_alpha=False, initial_alpha=0.2)
    for _ in range(100):
        batch = bandit_rows(64, rng)
        tuned.train_step(batch)
        fixed.train_step(batch)
    assert tuned.alpha < 0.9      # entropy ~1.4 nats above the target -1: alpha falls
    assert fixed.alpha == pytest.approx(0.2)


def test_target_critics_trail_the_online_ones_by_tau():
    lr = learner(tau=0.5)
    lr.train_step(bandit_rows(64, np.random.default_rng(2)))
    online, target = lr.critics[0].flat_weights(), lr.targets[0].flat_weights()
    assert not np.array_equal(online, target)
    before = target.copy()
    lr.train_step(bandit_rows(64, np.random.default_rng(3)))
    np.testing.assert_allclose(lr.targets[0].flat_weights(), 0.5 * before + 0.5 * lr.critics[0].flat_weights(),
                               atol=1e-6)


def test_log_pi_is_measured_on_the_unit_scale_whatever_the_bounds():
    """The entropy target -dim(A) means the same for any action bounds: SAC's log pi is the
    density of tanh(u), so two specs that differ only in their bounds give the same log pi."""
    narrow = PolicySpec(SPEC.obs_space, Box((1,), low=-0.1, high=0.1), hidden_sizes=(32, 32),
                        activation="relu", box_dist="squashed_gaussian")
    a, b = learner(), SACLearner(narrow, SACConfig(lr=3e-3, batch_size=64), device="cpu", seed=0)
    obs = {"": torch.from_numpy(np.random.default_rng(5).uniform(-1, 1, (64, 2)).astype(np.float32))}
    noise = torch.randn(64, 1, generator=torch.Generator().manual_seed(5))
    (actions_a, logp_a), (actions_b, logp_b) = a._sample(obs, noise), b._sample(obs, noise)
    np.testing.assert_allclose(logp_a.detach().numpy(), logp_b.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(actions_a.detach().numpy() / 20, actions_b.detach().numpy(), atol=1e-6)


def test_a_fixed_alpha_comes_from_the_config_on_resume():
    saved = learner(autotune_alpha=False, initial_alpha=0.2).state_dict()
    resumed = learner(autotune_alpha=False, initial_alpha=0.05)
    resumed.load_state_dict(saved)
    assert resumed.alpha == pytest.approx(0.05)


def test_state_dict_resumes_exactly():
    a, rng = learner(), np.random.default_rng(4)
    batches = [bandit_rows(32, rng) for _ in range(9)]
    for batch in batches[:5]:
        a.train_step(batch)
    a.env_steps = 777
    state = a.state_dict()
    b = learner(lr=0.5)  # the config's lr is kept, the saved one reported
    assert b.load_state_dict(state)["lr"] == pytest.approx(3e-3)
    assert b.hp.lr == 0.5 and all(o.param_groups[0]["lr"] == 0.5 for o in b._optimizers())
    b.set_hparams(lr=3e-3)
    for batch in batches[5:]:
        a.train_step(batch)
        b.train_step(batch)
    assert np.array_equal(a.flat_weights(), b.flat_weights())
    for mine, theirs in zip(a.critics + a.targets, b.critics + b.targets):
        assert np.array_equal(mine.flat_weights(), theirs.flat_weights())
    assert (a.updates, a.env_steps, a.alpha) == (b.updates, b.env_steps, b.alpha)
    with pytest.raises(ValueError, match="not a SAC"):
        b.load_state_dict({"format": 1, "algorithm": "dqn"})
    with pytest.raises(ValueError, match="autotune"):
        learner(autotune_alpha=False).load_state_dict(state)


def test_a_step_reads_nothing_back_until_its_stats_are_looked_at(monkeypatch):
    from tests.unit.test_learner_step import SyncCounter
    lr, rng = learner(max_grad_norm=1.0), np.random.default_rng(6)
    batches = [bandit_rows(64, rng) for _ in range(5)]
    counter = SyncCounter(monkeypatch)
    counter.inside = True
    stats = [lr.train_step(batch) for batch in batches]
    assert counter.count == 0
    assert stats[0]["critic_loss"] > 0 and counter.count == 1  # read once, when first looked at
    assert set(stats[-1]) == {"loss", "critic_loss", "q_mean", "td_abs_mean", "grad_norm",
                              "actor_loss", "entropy", "alpha"} and counter.count == 1


@pytest.mark.parametrize("max_grad_norm", [0.0, 1.0])
def test_a_non_finite_step_is_skipped_on_the_device(max_grad_norm):
    lr = learner(max_grad_norm=max_grad_norm)
    batch = bandit_rows(64, np.random.default_rng(7))
    batch["reward"][:] = np.inf
    actor, critic = lr.flat_weights(), lr.critics[0].flat_weights()
    stats = lr.train_step(batch)
    assert not np.isfinite(stats["critic_loss"]) and lr.critic_opt.step_count == 0
    np.testing.assert_array_equal(lr.critics[0].flat_weights(), critic)
    assert np.isfinite(lr.flat_weights()).all() and np.isfinite(lr.critics[0].flat_weights()).all()
    assert lr.updates == 1 and np.isfinite(actor).all()


def test_a_state_saved_on_another_kind_of_device_resumes():
    """A CUDA generator's state (16 bytes) does not fit a CPU generator: the resumed learner
    seeds its noise from it instead, the same way every time."""
    saved = learner().state_dict()
    saved["noise_rng"] = torch.arange(16, dtype=torch.uint8)
    a, b = learner(lr=0.5), learner(lr=0.5)
    for resumed in (a, b):
        resumed.load_state_dict(saved)
    assert torch.equal(a.noise.get_state(), b.noise.get_state())
    assert not torch.equal(a.noise.get_state(), learner().noise.get_state())
