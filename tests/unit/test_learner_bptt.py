"""A recurrent policy's PPO/APPO update: truncated BPTT over the connector's chunks from the
actor's stored states, padding masked, minibatches of whole chunks, exact resume."""
from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest
import torch

from rlinkd.daemon.config import PPOConfig
from rlinkd.daemon.learner import bptt
from rlinkd.daemon.learner.learner import Learner
from rlinkd.daemon.learner.ppo import ppo_loss_terms
from tests.recurrent_data import noisy_weights, pipeline_batch, small_spec
from tests.unit.test_learner_update import first_step_infos

HP = PPOConfig(lr=1e-3, num_epochs=3, minibatch_size=16, max_seq_len=4)
torch.set_num_threads(1)


def learner_on(spec, seed=0, hp=HP):
    learner = Learner(spec, hp, device="cpu", seed=seed, graphs=False)
    learner.model.load_flat(noisy_weights(spec, seed=3))
    return learner


@pytest.mark.parametrize("cell,algorithm", [("lstm", "ppo"), ("gru", "appo")])
def test_the_first_minibatch_reproduces_the_actors_log_probs(cell, algorithm):
    """The batch's log-probs came from the actor stepping its state; the learner's sequence
    forward from the stored chunk states gives the same numbers: ratio 1 at the first step
    (a state off by one step would not)."""
    spec = small_spec(cell, max_seq_len=4)
    learner = learner_on(spec)
    firsts = first_step_infos(learner)
    batch = pipeline_batch(spec, learner.flat_weights(), algorithm)
    before = learner.flat_weights()
    stats = learner.update(batch)
    assert firsts[0]["approx_kl"] < 1e-9 and firsts[0]["clip_frac"] == 0.0, firsts[0]
    assert np.isfinite(list(stats.values())).all()
    assert not np.array_equal(learner.flat_weights(), before)
    assert stats["n_rows"] == len(batch["actions"])


def test_a_shifted_start_state_breaks_the_ratio():
    """Not vacuous: the same batch with each chunk started from the NEXT step's state."""
    spec = small_spec("lstm", max_seq_len=4)
    learner = learner_on(spec)
    firsts = first_step_infos(learner)
    batch = pipeline_batch(spec, learner.flat_weights())
    starts = np.flatnonzero(batch["seq_start"])
    shifted = np.roll(batch["seq_state"], -1, axis=0)
    batch["seq_state"] = np.where(batch["seq_start"][:, None] > 0, shifted, 0.0).astype(np.float32)
    batch["seq_state"][starts[batch["episode_start"][starts] > 0]] = 0.0
    learner.update(batch)
    assert firsts[0]["approx_kl"] > 1e-6


def test_minibatches_are_whole_chunks():
    spec = small_spec("lstm", max_seq_len=4)
    learner = learner_on(spec)
    batch = pipeline_batch(spec, learner.flat_weights())
    data = learner._to_tensors(batch)
    chunks = data[bptt.SEQ]["rows"].shape[0]
    assert learner._plan_units(data) == (chunks, HP.minibatch_size // 4)
    mask = data[bptt.SEQ]["mask"]
    assert int(mask.sum()) == len(batch["actions"])               # every row once, pads masked
    assert (mask[:, 0] == 1).all()                                # no empty chunk


def test_the_masked_loss_ignores_padded_steps():
    rng = np.random.default_rng(0)
    cols = [torch.as_tensor(rng.normal(size=8).astype(np.float32)) for _ in range(6)]
    mask = torch.tensor([1, 1, 1, 0, 1, 1, 0, 0], dtype=torch.float32)
    keep = mask > 0
    kw = {"clip_coef": 0.2, "vf_coef": 0.5, "ent_coef": 0.01}
    loss, stats = ppo_loss_terms(*cols, mask=mask, **kw)
    loss_kept, stats_kept = ppo_loss_terms(*(c[keep] for c in cols), **kw)
    torch.testing.assert_close(loss, loss_kept)
    torch.testing.assert_close(stats, stats_kept)
    garbage = [c.clone() for c in cols]
    for c in garbage:
        c[~keep] = 1e3                                            # padding holds anything
    torch.testing.assert_close(ppo_loss_terms(*garbage, mask=mask, **kw)[0], loss)


def test_gradients_do_not_depend_on_padded_steps():
    spec = small_spec("gru", max_seq_len=4)
    learner = learner_on(spec)
    batch = pipeline_batch(spec, learner.flat_weights())
    data = learner._to_tensors(batch)
    idx = torch.arange(data[bptt.SEQ]["rows"].shape[0])

    def grads(d):
        mb, (logp, ent, values), mask = learner._minibatch(d, idx)
        loss, _ = ppo_loss_terms(logp, mb["logp"], mb["advantages"], values, mb["value_targets"],
                                 ent, clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, mask=mask)
        learner.model.zero_grad()
        loss.backward()
        return torch.cat([p.grad.reshape(-1) for p in learner.model.parameters() if p.grad is not None])

    reference = grads(data)
    pads = data[bptt.SEQ]["mask"] == 0
    assert pads.any()
    moved = {**data, bptt.SEQ: {**data[bptt.SEQ], "rows": torch.where(
        pads, torch.full_like(data[bptt.SEQ]["rows"], 5), data[bptt.SEQ]["rows"])}}
    torch.testing.assert_close(grads(moved), reference)


def test_a_recurrent_batch_without_its_sequences_is_refused():
    spec = small_spec("lstm")
    learner = learner_on(spec)
    batch = pipeline_batch(spec, learner.flat_weights())
    before = learner.flat_weights()
    for broken in ({"seq_state": None}, {"seq_state": np.full_like(batch["seq_state"], np.nan)}):
        bad = {k: v for k, v in {**batch, **broken}.items() if v is not None}
        with pytest.raises(ValueError, match="seq_state"):
            learner.update(bad)
    np.testing.assert_array_equal(learner.flat_weights(), before)


def test_resume_gives_bit_identical_recurrent_updates():
    """Nothing beyond the feed-forward checkpoint is needed: the state travels per fragment,
    so a resumed learner trains the next batches exactly as the original does."""
    spec = small_spec("lstm", max_seq_len=4)
    hp = replace(HP, normalize_observations=True)
    original = learner_on(spec, hp=hp)
    original.update(pipeline_batch(spec, original.flat_weights(), seed=0))
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    restored = Learner(spec, hp, device="cpu", seed=42, graphs=False)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    for seed in (1, 2):
        batch = pipeline_batch(spec, original.flat_weights(), seed=seed)
        a, b = original.update(batch), restored.update(batch)
        a.pop("update_time_s"), b.pop("update_time_s")
        assert a == b
        np.testing.assert_array_equal(restored.flat_weights(), original.flat_weights())
