"""Learner: training on synthetic data, live hyper-parameters, normaliser, exact resume."""

import io
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import torch

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.config import PPOConfig
from rlinkd.daemon.learner.learner import Learner, explained_variance
from rlinkd.daemon.learner.model import ObsNormalizer
from rlinkd.daemon.learner.ppo import STAT_NAMES, ppo_loss

CARTPOLE = PolicySpec(Box((4,)), Discrete(2))
BOX = PolicySpec(Box((3,)), Box((2,), low=-1.0, high=1.0), hidden_sizes=(32, 32))
HP = partial(PPOConfig, lr=3e-4, num_epochs=4, minibatch_size=64)  # small, quick updates
torch.set_num_threads(1)  # as the learner process runs by default ([learner] torch_threads)


def make_batch(spec, learner, n=512, seed=0):
    """On-policy synthetic batch: advantage +1 when the action 'agrees' with obs[0]."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n, spec.obs_size)).astype(np.float32)
    flat = learner.flat_weights()
    dist = spec.actor_forward(flat, obs)
    actions = spec.sample_actions(dist, rng)
    first = actions[:, 0]  # actions: float32 [N, action_size] (Discrete: the index)
    agree = (first > 0.5) == (obs[:, 0] > 0) if not spec.is_box else first * obs[:, 0] > 0
    return {"obs": obs, "actions": actions, "logp": spec.log_prob(dist, actions),
            "advantages": np.where(agree, 1.0, -1.0).astype(np.float32),
            "value_targets": (2.0 * obs[:, 0] + 1.0).astype(np.float32),
            "values": spec.value_forward(flat, obs)}


def full_batch_loss(learner, batch):
    """The PPO loss of the whole batch under the learner's current weights."""
    t = {k: torch.as_tensor(v) for k, v in batch.items()}
    with torch.no_grad():
        logp, ent = learner.model.log_prob_entropy(t["obs"], t["actions"])
        values = learner.model.value(t["obs"])
    _, info = ppo_loss(logp, t["logp"], t["advantages"], values, t["value_targets"], ent,
                       clip_coef=0.2, vf_coef=0.5, ent_coef=0.0)
    return info


@pytest.mark.parametrize("spec", [CARTPOLE, BOX])
def test_updates_decrease_loss(spec):
    learner = Learner(spec, HP(lr=1e-3), device="cpu", seed=0)
    batch = make_batch(spec, learner)
    before = full_batch_loss(learner, batch)
    stats = [learner.update(batch) for _ in range(3)]
    after = full_batch_loss(learner, batch)
    assert after["loss"] < before["loss"] - 0.05
    assert after["vf_loss"] < 0.8 * before["vf_loss"]
    assert after["pg_loss"] < before["pg_loss"]
    assert learner.updates == 3 and learner.trained_steps == 3 * 512
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac",
                "explained_variance", "grad_norm", "n_rows", "update_time_s", "epochs"):
        assert isinstance(stats[-1][key], float) and np.isfinite(stats[-1][key]), key
    assert stats[0]["n_rows"] == 512.0 and stats[0]["epochs"] == 4.0
    assert stats[0]["approx_kl"] > 0.0


def test_box_policy_mean_moves_toward_positive_advantage():
    learner = Learner(BOX, HP(lr=1e-3, num_epochs=8), device="cpu", seed=1)
    probe = np.array([[1.0, 0.0, 0.0]], np.float32)  # obs[0] > 0: larger action 0 is better
    mean_before = BOX.actor_forward(learner.flat_weights(), probe)[0, 0]
    for seed in range(3):
        learner.update(make_batch(BOX, learner, seed=seed))
    assert BOX.actor_forward(learner.flat_weights(), probe)[0, 0] > mean_before + 0.05


def test_float_discrete_actions_are_accepted_as_integers():
    learner = Learner(CARTPOLE, HP(num_epochs=1), device="cpu")
    batch = make_batch(CARTPOLE, learner)
    twin = Learner(CARTPOLE, HP(num_epochs=1), device="cpu")
    learner.update(batch)
    column = batch["actions"].astype(np.float32).reshape(-1, 1)  # the train-slot column
    twin.update({**batch, "actions": column})
    np.testing.assert_array_equal(learner.flat_weights(), twin.flat_weights())


def test_gradients_are_clipped_to_max_grad_norm_before_each_step():
    learner = Learner(CARTPOLE, HP(max_grad_norm=0.05, num_epochs=2), device="cpu")
    batch = make_batch(CARTPOLE, learner)
    batch["advantages"] *= 1000.0  # raw gradients far above the limit
    applied = []
    step = learner.optimizer.step

    def recording_step(gate=None):
        grads = [p.grad.norm() for p in learner.model.parameters() if p.grad is not None]
        applied.append(float(torch.linalg.vector_norm(torch.stack(grads))))
        step(gate)
    learner.optimizer.step = recording_step
    stats = learner.update(batch)
    assert len(applied) == 2 * 512 // 64
    assert max(applied) <= 0.05 * (1 + 1e-4), max(applied)
    assert stats["grad_norm"] > 1.0  # the reported norm is the raw one, before clipping


def test_set_hparams_lr_zero_freezes_weights():
    learner = Learner(CARTPOLE, HP(), device="cpu")
    batch = make_batch(CARTPOLE, learner)
    learner.set_hparams(lr=0.0)
    before = learner.flat_weights()
    learner.update(batch)
    np.testing.assert_array_equal(learner.flat_weights(), before)
    learner.set_hparams(lr=1e-3)
    learner.update(batch)
    assert not np.array_equal(learner.flat_weights(), before)


def test_set_hparams_ent_coef_drives_actor_when_advantages_are_zero():
    learner = Learner(CARTPOLE, HP(ent_coef=0.0), device="cpu")
    batch = make_batch(CARTPOLE, learner)
    batch["advantages"] = np.zeros_like(batch["advantages"])
    actor = slice(8, 8 + 4610)  # pi.* weights in the flat layout
    before = learner.flat_weights()
    learner.update(batch)  # zero policy gradient and no entropy bonus: Adam leaves pi alone
    np.testing.assert_array_equal(learner.flat_weights()[actor], before[actor])
    learner.set_hparams(ent_coef=0.5)
    learner.update(batch)
    assert not np.array_equal(learner.flat_weights()[actor], before[actor])
    with pytest.raises(ValueError):
        learner.set_hparams(lr=float("nan"))


def test_target_kl_stops_after_first_epoch():
    learner = Learner(CARTPOLE, HP(num_epochs=6, target_kl=1e-9, lr=1e-3), device="cpu")
    assert learner.update(make_batch(CARTPOLE, learner))["epochs"] == 1.0
    learner.hp = replace(learner.hp, target_kl=0.0)  # the config's "0 = never"
    assert learner.update(make_batch(CARTPOLE, learner))["epochs"] == 6.0


@pytest.mark.parametrize("broken", [
    {"logp": None},
    {"advantages": np.full(512, np.nan, np.float32)},
    {"actions": np.full(512, 2)},
    {"values": np.zeros(511, np.float32)},
])
def test_bad_batch_raises_and_leaves_model_untouched(broken):
    learner = Learner(CARTPOLE, HP(), device="cpu")
    batch = {**make_batch(CARTPOLE, learner), **broken}
    batch = {k: v for k, v in batch.items() if v is not None}
    before = learner.flat_weights()
    with pytest.raises(ValueError):
        learner.update(batch)
    np.testing.assert_array_equal(learner.flat_weights(), before)
    assert learner.updates == 0


def test_obs_normalizer_merges_batches_exactly():
    rng = np.random.default_rng(0)
    a, b = rng.normal(3.0, 2.0, (100, 4)), rng.normal(-1.0, 0.5, (37, 4))
    norm = ObsNormalizer(4)
    np.testing.assert_array_equal(norm.std, 1.0)
    norm.update(a)
    norm.update(b)
    both = np.concatenate([a, b])
    np.testing.assert_allclose(norm.mean, both.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(norm.var, both.var(axis=0), rtol=1e-12)
    assert norm.count == 137


def test_learner_normalizer_reaches_the_published_weights():
    learner = Learner(CARTPOLE, HP(normalize_observations=True), device="cpu")
    batch = make_batch(CARTPOLE, learner, n=2)
    batch["obs"] = np.array([[1.0, 2.0, 3.0, 4.0], [3.0, 2.0, 5.0, 0.0]], np.float32)
    learner.update(batch)
    params = CARTPOLE.split_flat(learner.flat_weights())
    np.testing.assert_allclose(params["obs_mean"], [2.0, 2.0, 4.0, 2.0])
    np.testing.assert_allclose(params["obs_std"], [1.0, 1e-4, 1.0, 2.0], rtol=1e-6)
    plain = Learner(CARTPOLE, HP(), device="cpu")
    plain.update(batch)  # disabled: the buffers stay the identity
    np.testing.assert_array_equal(CARTPOLE.split_flat(plain.flat_weights())["obs_std"], 1.0)


def test_a_restarted_learner_folds_new_data_into_the_published_statistics():
    """A restarted learner resumes an older checkpoint, then adopts the board's newer weights:
    its normaliser takes their statistics (keeping its count), so the next batch moves them
    on from there instead of back towards the checkpoint's."""
    def shifted(learner, seed: int, loc: float) -> dict:
        batch = make_batch(CARTPOLE, learner, n=256, seed=seed)
        batch["obs"] = (batch["obs"] + loc).astype(np.float32)
        return batch
    first = Learner(CARTPOLE, HP(normalize_observations=True), device="cpu")
    first.update(shifted(first, 0, 0.0))
    checkpoint = first.state_dict()
    for seed in (1, 2, 3):
        first.update(shifted(first, seed, 10.0))
    published = first.flat_weights()
    published_mean = CARTPOLE.split_flat(published)["obs_mean"]
    restarted = Learner(CARTPOLE, HP(normalize_observations=True), device="cpu")
    restarted.load_state_dict(checkpoint)
    restarted.adopt_weights(published)
    np.testing.assert_allclose(restarted.normalizers[""].mean, published_mean, rtol=1e-6)
    restarted.update(shifted(restarted, 4, 10.0))
    after = CARTPOLE.split_flat(restarted.flat_weights())["obs_mean"]
    assert (after > 5.0).all(), (published_mean, after)  # (the checkpoint's mean is ~0)


def test_explained_variance():
    assert explained_variance(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0])) == 1.0
    # residual [1, -1, 0] has variance 2/3; targets [1, 2, 3] too -> 0
    assert explained_variance(np.array([0.0, 3.0, 3.0]), np.array([1.0, 2.0, 3.0])) == \
        pytest.approx(0.0)
    assert np.isnan(explained_variance(np.zeros(3), np.ones(3)))


@pytest.mark.parametrize("spec", [CARTPOLE, BOX])
def test_checkpoint_round_trip_gives_bit_identical_updates(spec):
    hp = HP(normalize_observations=True, lr=1e-3)
    original = Learner(spec, hp, device="cpu", seed=0)
    original.update(make_batch(spec, original, seed=0))
    original.set_hparams(lr=5e-4, ent_coef=0.01)

    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    restored = Learner(spec, replace(hp, lr=5e-4, ent_coef=0.01), device="cpu", seed=99)
    saved = restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert saved == {"lr": 5e-4, "ent_coef": 0.01}
    np.testing.assert_array_equal(restored.flat_weights(), original.flat_weights())

    for seed in (1, 2):  # two updates: optimizer moments, normaliser and RNG carried over
        batch = make_batch(spec, original, seed=seed)
        stats_a, stats_b = original.update(batch), restored.update(batch)
        stats_a.pop("update_time_s"), stats_b.pop("update_time_s")
        assert stats_a == stats_b
        np.testing.assert_array_equal(restored.flat_weights(), original.flat_weights())
    assert (restored.updates, restored.trained_steps) == (3, 3 * 512)
    assert restored.normalizers[""].count == original.normalizers[""].count == 3 * 512


def test_state_dict_is_a_snapshot():
    learner = Learner(CARTPOLE, HP(), device="cpu")
    batch = make_batch(CARTPOLE, learner)
    learner.update(batch)
    state = learner.state_dict()
    saved = state["optimizer"]["exp_avg"][0].clone()
    learner.update(batch)
    torch.testing.assert_close(state["optimizer"]["exp_avg"][0], saved, rtol=0, atol=0)
    with pytest.raises(ValueError):
        learner.load_state_dict({**state, "format_version": 999})


# ---------------------------------------------------------------- issue 16 (tests first)
def test_resume_keeps_configured_hparams_and_restores_optimizer_state():
    """The config wins for hyperparameters, the checkpoint for state."""
    saved_from = Learner(CARTPOLE, HP(lr=1e-3, ent_coef=0.0), device="cpu", seed=0)
    saved_from.update(make_batch(CARTPOLE, saved_from, seed=0))  # lr A, ent_coef A
    state = saved_from.state_dict()
    resumed = Learner(CARTPOLE, HP(lr=5e-4, ent_coef=0.02), device="cpu", seed=5)  # B
    resumed.load_state_dict(state)
    assert resumed.optimizer.param_groups[0]["lr"] == 5e-4
    assert resumed.live_hparams() == {"lr": 5e-4, "ent_coef": 0.02}
    assert resumed.optimizer.step_count == saved_from.optimizer.step_count > 0
    for mine, saved in zip(resumed.optimizer.exp_avg_sq, saved_from.optimizer.exp_avg_sq):
        torch.testing.assert_close(mine, saved, rtol=0, atol=0)
    saved_from.set_hparams(lr=5e-4, ent_coef=0.02)  # the same state, trained with B
    batch = make_batch(CARTPOLE, saved_from, seed=1)
    saved_from.update(batch), resumed.update(batch)
    np.testing.assert_array_equal(resumed.flat_weights(), saved_from.flat_weights())


def first_step_infos(learner):
    """Record the stats of the first minibatch step of every update (wraps _sgd_step)."""
    seen, step = [], learner._sgd_step

    def recording(data, idx):
        info = step(data, idx)
        seen.append(dict(zip(STAT_NAMES, info.tolist())))
        return info
    learner._sgd_step = recording
    firsts = []
    real_update = learner.update

    def update(batch, *args, **kwargs):
        seen.clear()
        stats = real_update(batch, *args, **kwargs)
        firsts.append(seen[0])
        return stats
    learner.update = update
    return firsts


def test_normaliser_moves_after_the_update_so_the_first_ratio_is_one():
    """The batch's logp/values came from the published weights, normaliser buffers included:
    `update` trains under those buffers and folds the batch's obs in only afterwards."""
    learner = Learner(CARTPOLE, HP(normalize_observations=True, lr=1e-3), device="cpu")
    with torch.no_grad():
        learner.model.tensor("pi.2.weight").mul_(100.0)  # a decided policy, far from uniform
    firsts = first_step_infos(learner)
    for seed in range(3):
        batch = make_batch(CARTPOLE, learner, seed=seed)  # logp/values from the current weights
        batch["obs"] = (3.0 * batch["obs"] + 5.0).astype(np.float32)
        dist = CARTPOLE.actor_forward(learner.flat_weights(), batch["obs"])
        batch["logp"] = CARTPOLE.log_prob(dist, batch["actions"])
        batch["values"] = CARTPOLE.value_forward(learner.flat_weights(), batch["obs"])
        before = learner.flat_weights()
        learner.update(batch)
        assert firsts[-1]["approx_kl"] < 1e-6 and firsts[-1]["clip_frac"] == 0.0, firsts[-1]
        moved = CARTPOLE.split_flat(learner.flat_weights())["obs_mean"]
        assert not np.allclose(moved, CARTPOLE.split_flat(before)["obs_mean"])  # it did move
        if seed == 0:  # not vacuous: under the moved normaliser the ratio would be far from 1
            params = CARTPOLE.split_flat(before)
            params["obs_mean"], params["obs_std"] = moved, CARTPOLE.split_flat(
                learner.flat_weights())["obs_std"]
            shifted = np.concatenate([params[name].reshape(-1)
                                      for name, _ in CARTPOLE.param_layout()])
            logp = CARTPOLE.log_prob(CARTPOLE.actor_forward(shifted, batch["obs"]), batch["actions"])
            assert np.abs(logp - batch["logp"]).mean() > 0.1
    assert learner.normalizers[""].count == 3 * 512


def test_update_reports_progress_after_every_minibatch_step():
    """The learner process heart-beats from this hook, so a long update is not a hang."""
    learner = Learner(CARTPOLE, HP(num_epochs=3, minibatch_size=100), device="cpu")
    batch = make_batch(CARTPOLE, learner, n=512)
    steps = []
    learner.update(batch, on_step=lambda: steps.append(learner.optimizer.step_count))
    assert steps == list(range(1, 3 * 6 + 1))  # ceil(512 / 100) = 6 minibatches per epoch
