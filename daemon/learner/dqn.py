"""DQN (Mnih et al. 2015) with double-Q targets (van Hasselt et al. 2016) and n-step returns,
as pure functions, plus the linear schedules (the epsilon the clients apply, the optional
learning-rate decay) and the optional uniform
initialisation of the Q-network's layers.

The Q-network is the policy network of the spec: its ``action_dist_inputs`` output (the
categorical logits of a PPO policy) holds Q(s, .) here, so clients, the ONNX graph and the
numpy forward need nothing new: the greedy action is the argmax, masked actions are
MASKED_LOGIT. Replay rows carry n-step returns with their discount folded in
(``connector.transitions``): the target of a row is ``reward + discount * Q_target(s', a*)``.
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F


def double_q_targets(rewards: torch.Tensor, discounts: torch.Tensor, next_q_online: torch.Tensor,
                     next_q_target: torch.Tensor, double_q: bool = True) -> torch.Tensor:
    """TD targets [B] from rewards [B], discounts [B] (g^m, 0 at a terminal) and Q(s', .) [B, A]
    of the online and the target network.

        a*     = argmax_a Q_online(s', a)    (double Q; plain DQN: argmax of Q_target)
        target = r + discount * Q_target(s', a*)
    """
    chooser = next_q_online if double_q else next_q_target                  # [B, A]
    best = chooser.argmax(dim=1, keepdim=True)                              # [B, 1]
    return rewards + discounts * next_q_target.gather(1, best)[:, 0]        # [B]


DQN_STATS = ("loss", "q_mean", "td_abs_mean")


def dqn_loss_terms(q: torch.Tensor, actions: torch.Tensor, targets: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Huber loss between Q(s, a) and the (detached) targets; q [B, A], actions [B] indices,
    targets [B]. Returns (loss, detached [3] in ``DQN_STATS`` order), read nothing back."""
    q_taken = q.gather(1, actions.long()[:, None])[:, 0]                     # [B]
    loss = F.smooth_l1_loss(q_taken, targets.detach())
    with torch.no_grad():
        stats = torch.stack([loss, q_taken.mean(), (q_taken - targets).abs().mean()])
    return loss, stats


def dqn_loss(q: torch.Tensor, actions: torch.Tensor, targets: torch.Tensor
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """``dqn_loss_terms`` with its statistics as python floats by name (one device sync)."""
    loss, stats = dqn_loss_terms(q, actions, targets)
    return loss, dict(zip(DQN_STATS, stats.tolist()))


def linear_schedule(env_steps: int, start: float, end: float, decay_steps: int) -> float:
    """A rate after ``env_steps`` (epsilon; the learning rate with ``dqn.lr_decay_steps``):
    from ``start`` to ``end`` linearly over ``decay_steps`` env steps, then ``end``."""
    if decay_steps <= 0:
        return end
    fraction = min(1.0, max(0, env_steps) / decay_steps)
    return start + fraction * (end - start)


def fan_in_uniform(weight_shape: tuple[int, ...], bias_shape: tuple[int, ...],
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh (weight, bias) of one linear or convolution layer as torch's ``nn.Linear`` /
    ``nn.Conv2d`` draw them (``dqn.weight_init = "uniform"``, what SB3's DQN starts from):
    both ~ U(-b, b) with b = 1 / sqrt(fan_in), fan_in = prod(weight_shape[1:]) (torch's
    kaiming_uniform_ with a = sqrt 5 reduces to this bound). CPU float32 tensors."""
    bound = 1.0 / math.sqrt(math.prod(weight_shape[1:]))
    weight = torch.empty(weight_shape).uniform_(-bound, bound, generator=generator)
    bias = torch.empty(bias_shape).uniform_(-bound, bound, generator=generator)
    return weight, bias
