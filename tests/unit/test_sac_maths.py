"""learner.sac: soft TD targets, the critic, actor and entropy-coefficient losses and the
Polyak update, each against values computed by hand."""
from __future__ import annotations

import math

import pytest
import torch

from rlinkd.daemon.learner.sac import (actor_loss, alpha_loss, critic_loss, polyak_update,
                                       soft_q_targets)

T = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731


def test_soft_q_targets_take_the_smaller_critic_less_the_entropy_term():
    # row 0: min(2, 3) - 0.5 * (-1) = 2.5 -> 1 + 0.9 * 2.5 = 3.25; row 1: terminal -> the reward
    y = soft_q_targets(T(1.0, -2.0), T(0.9, 0.0), T(2.0, 7.0), T(3.0, 5.0), T(-1.0, 4.0), 0.5)
    assert y.tolist() == pytest.approx([3.25, -2.0])


def test_critic_loss_sums_both_mean_squared_errors_and_ignores_target_gradients():
    q1, q2 = T(1.0, 2.0).requires_grad_(True), T(0.0, 4.0).requires_grad_(True)
    y = T(2.0, 2.0).requires_grad_(True)
    loss, info = critic_loss(q1, q2, y)
    # q1: ((1-2)^2 + 0) / 2 = 0.5; q2: (4 + 4) / 2 = 4
    assert float(loss.detach()) == pytest.approx(4.5) and info["critic_loss"] == pytest.approx(4.5)
    assert info["q_mean"] == pytest.approx(1.5) and info["td_abs_mean"] == pytest.approx(0.5)
    loss.backward()
    assert y.grad is None and q1.grad.tolist() == pytest.approx([-1.0, 0.0])


def test_actor_loss_is_alpha_log_pi_less_the_smaller_q():
    logp = T(-1.0, 0.5)
    loss, info = actor_loss(T(1.0, 3.0), T(2.0, -1.0), logp, 0.2)
    # row 0: 0.2 * -1 - 1 = -1.2; row 1: 0.2 * 0.5 - (-1) = 1.1; mean -0.05
    assert float(loss) == pytest.approx(-0.05) and info["entropy"] == pytest.approx(0.25)


def test_alpha_rises_when_entropy_is_below_target_and_falls_above():
    log_alpha = torch.tensor(math.log(0.3), dtype=torch.float64, requires_grad=True)
    low_entropy = T(2.0, 2.0)   # entropy about -2 < target -1: alpha must rise
    loss = alpha_loss(log_alpha, low_entropy, target_entropy=-1.0)
    # -(log 0.3) * (2 - 1) = 1.2040; d/d log_alpha = -(2 - 1) = -1
    assert float(loss.detach()) == pytest.approx(-math.log(0.3))
    loss.backward()
    assert float(log_alpha.grad) == pytest.approx(-1.0)  # gradient descent raises log alpha
    log_alpha.grad = None
    alpha_loss(log_alpha, T(0.0, 0.0), target_entropy=-1.0).backward()  # entropy 0 > -1
    assert float(log_alpha.grad) == pytest.approx(1.0)


def test_polyak_moves_each_target_by_tau():
    target, online = [T(0.0, 10.0), T(4.0)], [T(1.0, 0.0), T(8.0)]
    polyak_update(target, online, 0.25)
    assert target[0].tolist() == [0.25, 7.5] and target[1].tolist() == [5.0]
