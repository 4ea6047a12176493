"""ppo_loss against hand-computed values, with clipping active and inactive."""

import math

import pytest
import torch

from rlinkd.daemon.learner.ppo import ppo_loss


def _inputs(**overrides):
    # ratio = [1.5, 0.9]; advantages [1, -2]; clip 0.2
    #   row 0: -A r = -1.5, clipped -A*1.2 = -1.2 -> max = -1.2 (clip active, no gradient)
    #   row 1: -A r = 1.8, 0.9 inside [0.8, 1.2]   -> 1.8  (clip inactive)
    # pg_loss = (-1.2 + 1.8) / 2 = 0.3
    # value errors [1, 1] -> vf_loss = 0.5 * 1 = 0.5; entropy mean = 1.0
    d = dict(
        new_logp=torch.tensor([math.log(1.5), math.log(0.9)], requires_grad=True),
        old_logp=torch.tensor([0.0, 0.0]),
        advantages=torch.tensor([1.0, -2.0]),
        new_values=torch.tensor([1.0, 2.0], requires_grad=True),
        value_targets=torch.tensor([0.0, 3.0]),
        entropy=torch.tensor([0.5, 1.5]),
    )
    d.update(overrides)
    return d


def test_ppo_loss_hand_computed():
    loss, info = ppo_loss(**_inputs(), clip_coef=0.2, vf_coef=0.5, ent_coef=0.01)
    assert loss.item() == pytest.approx(0.3 + 0.5 * 0.5 - 0.01 * 1.0, abs=1e-6)
    assert info["pg_loss"] == pytest.approx(0.3, abs=1e-6)
    assert info["vf_loss"] == pytest.approx(0.5, abs=1e-6)
    assert info["entropy"] == pytest.approx(1.0, abs=1e-6)
    kl = ((0.5 - math.log(1.5)) + (-0.1 - math.log(0.9))) / 2
    assert info["approx_kl"] == pytest.approx(kl, abs=1e-6)
    assert info["clip_frac"] == pytest.approx(0.5)
    assert all(isinstance(v, float) for v in info.values())


def test_ppo_loss_clipped_row_has_no_policy_gradient():
    inputs = _inputs()
    loss, _ = ppo_loss(**inputs, clip_coef=0.2, vf_coef=0.5, ent_coef=0.0)
    loss.backward()
    # d/dlogp of mean(-A r) = -A r / B: row 0 clipped -> 0; row 1: 2 * 0.9 / 2 = 0.9
    torch.testing.assert_close(inputs["new_logp"].grad, torch.tensor([0.0, 0.9]))
    # d/dv of vf_coef * 0.5 * mean((v - t)^2) = vf_coef * (v - t) / B = [0.25, -0.25]
    torch.testing.assert_close(inputs["new_values"].grad, torch.tensor([0.25, -0.25]))


def test_ppo_loss_no_clipping_when_ratio_inside_range():
    inputs = _inputs(new_logp=torch.tensor([math.log(1.1), math.log(0.95)]))
    _, info = ppo_loss(**inputs, clip_coef=0.2, vf_coef=0.5, ent_coef=0.0)
    assert info["pg_loss"] == pytest.approx((-1.1 + 2 * 0.95) / 2, abs=1e-6)
    assert info["clip_frac"] == 0.0


def test_ppo_loss_value_clipping():
    # new [1, 2], targets [1.2, 3], old [0.5, 2.5], vf_clip 0.2
    #   row 0: unclipped 0.04, clipped 0.7 -> 0.25; max 0.25
    #   row 1: unclipped 1.00, clipped 2.3 -> 0.49; max 1.00
    # vf_loss = 0.5 * (0.25 + 1.0) / 2 = 0.3125 (unclipped would be 0.26)
    inputs = _inputs(value_targets=torch.tensor([1.2, 3.0]))
    _, plain = ppo_loss(**inputs, clip_coef=0.2, vf_coef=0.5, ent_coef=0.0)
    _, clipped = ppo_loss(**inputs, clip_coef=0.2, vf_coef=0.5, ent_coef=0.0,
                          old_values=torch.tensor([0.5, 2.5]), vf_clip=0.2)
    assert plain["vf_loss"] == pytest.approx(0.26, abs=1e-6)
    assert clipped["vf_loss"] == pytest.approx(0.3125, abs=1e-6)
