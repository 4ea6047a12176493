"""Soft actor-critic (Haarnoja et al. 2018, "SAC: algorithms and applications": twin Q,
target critics, automatic entropy tuning) as pure functions, read top to bottom like the paper.

Notation: s, a from the replay buffer; s' the state n steps later; the actor pi is a
tanh-squashed Gaussian (``TorchActionDist.rsample``), its log pi measured on the actions
rescaled to [-1, 1] (so the entropy target means the same for any bounds); alpha the entropy
coefficient, learned as log(alpha). Replay rows carry n-step returns with the discount folded in
(``connector.transitions``): ``discount`` is gamma^m, 0 when the episode terminated.

    y        = r + discount * (min_i Q_targ_i(s', a') - alpha * log pi(a'|s')),  a' ~ pi(.|s')
    L_Q      = sum_i mean((Q_i(s, a) - y)^2)
    L_pi     = mean(alpha * log pi(a~|s) - min_i Q_i(s, a~)),                 a~ ~ pi(.|s)
    L_alpha  = -mean(log(alpha) * (log pi(a~|s) + target_entropy))
    Q_targ_i <- (1 - tau) * Q_targ_i + tau * Q_i
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.nn import functional as F


def soft_q_targets(rewards: torch.Tensor, discounts: torch.Tensor, next_q1: torch.Tensor,
                   next_q2: torch.Tensor, next_logp: torch.Tensor, alpha: float | torch.Tensor
                   ) -> torch.Tensor:
    """y [B] from rewards [B], discounts [B], the target critics' Q(s', a') [B] and
    log pi(a'|s') [B] of actions a' freshly drawn at s'."""
    soft_value = torch.min(next_q1, next_q2) - alpha * next_logp              # [B]
    return rewards + discounts * soft_value                                 # [B]


CRITIC_STATS = ("critic_loss", "q_mean", "td_abs_mean")
ACTOR_STATS = ("actor_loss", "entropy")


def critic_loss_terms(q1: torch.Tensor, q2: torch.Tensor, targets: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of both critics' mean squared errors against the (detached) targets; q1, q2,
    targets [B]. Returns (loss, detached [3] in ``CRITIC_STATS`` order); reads nothing back."""
    y = targets.detach()
    loss = F.mse_loss(q1, y) + F.mse_loss(q2, y)
    with torch.no_grad():
        stats = torch.stack([loss, q1.mean(), (q1 - y).abs().mean()])
    return loss, stats


def critic_loss(q1: torch.Tensor, q2: torch.Tensor, targets: torch.Tensor
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """``critic_loss_terms`` with its statistics as python floats by name (one device read)."""
    loss, stats = critic_loss_terms(q1, q2, targets)
    return loss, dict(zip(CRITIC_STATS, stats.tolist()))


def actor_loss_terms(q1_pi: torch.Tensor, q2_pi: torch.Tensor, logp_pi: torch.Tensor,
                     alpha: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mean(alpha * log pi(a~|s) - min_i Q_i(s, a~)) for reparameterised a~ (gradients reach
    the actor through a~ and log pi; alpha is a constant here). Returns (loss, detached [2]
    in ``ACTOR_STATS`` order: actor_loss, entropy the batch estimate -mean(log pi))."""
    loss = (alpha * logp_pi - torch.min(q1_pi, q2_pi)).mean()
    with torch.no_grad():
        stats = torch.stack([loss, -logp_pi.mean()])
    return loss, stats


def actor_loss(q1_pi: torch.Tensor, q2_pi: torch.Tensor, logp_pi: torch.Tensor,
               alpha: float | torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """``actor_loss_terms`` with its statistics as python floats by name (one device read)."""
    loss, stats = actor_loss_terms(q1_pi, q2_pi, logp_pi, alpha)
    return loss, dict(zip(ACTOR_STATS, stats.tolist()))


def alpha_loss(log_alpha: torch.Tensor, logp_pi: torch.Tensor, target_entropy: float
               ) -> torch.Tensor:
    """-mean(log alpha * (log pi + target_entropy)): alpha rises while the policy's entropy
    (-log pi) is below the target and falls while it is above."""
    return -(log_alpha * (logp_pi.detach() + target_entropy)).mean()


@torch.no_grad()
def polyak_update(targets: Iterable[torch.Tensor], online: Iterable[torch.Tensor], tau: float) -> None:
    """target <- (1 - tau) * target + tau * online, tensor by tensor (in place)."""
    targets, online = list(targets), list(online)
    torch._foreach_lerp_(targets, online, tau)
