"""learner.dqn: double-Q targets, the Huber loss, the epsilon schedule and the uniform
layer initialisation by hand."""
from __future__ import annotations

import pytest
import torch

from rlinkd.daemon.learner.dqn import double_q_targets, dqn_loss, fan_in_uniform, linear_schedule


def test_double_q_takes_the_online_argmax_valued_by_the_target_network():
    rewards, discounts = torch.tensor([1.0, 0.5]), torch.tensor([0.9, 0.0])
    online = torch.tensor([[1.0, 3.0], [5.0, 0.0]])
    target = torch.tensor([[10.0, 2.0], [7.0, 8.0]])
    # row 0: a* = 1 (online), target Q = 2 -> 1 + 0.9 * 2; row 1: terminal -> 0.5
    assert double_q_targets(rewards, discounts, online, target).tolist() == pytest.approx([2.8, 0.5])
    # plain DQN: max of the target network -> 1 + 0.9 * 10
    assert double_q_targets(rewards, discounts, online, target, double_q=False).tolist() == \
        pytest.approx([10.0, 0.5])


def test_huber_loss_of_the_taken_actions():
    q = torch.tensor([[1.0, 2.0], [0.0, -1.0]], requires_grad=True)
    loss, info = dqn_loss(q, torch.tensor([1, 0]), torch.tensor([2.5, 3.0]))
    # errors 0.5 (quadratic: 0.125) and 3.0 (linear: 2.5) -> mean 1.3125
    assert loss.item() == pytest.approx(1.3125) and info["td_abs_mean"] == pytest.approx(1.75)
    loss.backward()
    assert q.grad.flatten().tolist() == pytest.approx([0.0, -0.25, -0.5, 0.0])


def test_linear_schedule():
    assert linear_schedule(0, 1.0, 0.1, 100) == 1.0
    assert linear_schedule(50, 1.0, 0.1, 100) == pytest.approx(0.55)
    assert linear_schedule(10_000, 1.0, 0.1, 100) == pytest.approx(0.1)
    assert linear_schedule(5, 1.0, 0.1, 0) == 0.1


def test_fan_in_uniform_draws_like_torch_linear_within_one_over_sqrt_fan_in():
    weight, bias = fan_in_uniform((64, 16), (64,), torch.Generator().manual_seed(0))
    assert weight.shape == (64, 16) and bias.shape == (64,) and weight.dtype == torch.float32
    bound = 1 / 16 ** 0.5
    assert weight.abs().max() <= bound and bias.abs().max() <= bound
    assert weight.std().item() == pytest.approx(bound / 3 ** 0.5, rel=0.1)  # U(-b, b): b / sqrt 3
    conv, _ = fan_in_uniform((8, 3, 4, 4), (8,), torch.Generator().manual_seed(0))
    assert conv.abs().max() <= 1 / 48 ** 0.5 and conv.abs().max() > 0.9 / 48 ** 0.5  # fan_in 3*4*4
    again, _ = fan_in_uniform((64, 16), (64,), torch.Generator().manual_seed(0))
    assert torch.equal(weight, again)
    # the bound of torch's own nn.Linear initialisation
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 64)
    assert layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.95 * bound
