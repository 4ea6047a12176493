"""The PPO clipped-surrogate loss (Schulman et al. 2017), as one pure function."""

from __future__ import annotations

import torch

MAX_LOG_RATIO = 20.0
"""|log π_new − log π_old| is clamped here before exp: a client can send any old log-prob,
and exp(1e4) would turn the loss (and then the weights) into inf/NaN for everyone."""


STAT_NAMES = ("loss", "pg_loss", "vf_loss", "entropy", "approx_kl", "clip_frac")
"""The diagnostics of one minibatch, in the order ``ppo_loss_terms`` returns them."""


def ppo_loss_terms(new_logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                   new_values: torch.Tensor, value_targets: torch.Tensor, entropy: torch.Tensor,
                   *, clip_coef: float, vf_coef: float, ent_coef: float | torch.Tensor,
                   old_values: torch.Tensor | None = None, vf_clip: float | None = None,
                   mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scalar loss to minimise, and its detached diagnostics [6] in ``STAT_NAMES`` order
    (loss, pg_loss, vf_loss, entropy mean, approx_kl = mean of (r - 1) - log r, clip_frac),
    on the device: nothing is read back to the host. ``ent_coef`` may be a 0-dim tensor
    (the learner's reloadable one).

    All inputs are [B]. The value loss is 0.5 * MSE, clipped around `old_values` by `vf_clip`
    when both are given. `mask` [B] (a recurrent policy's padded chunks: 1 on real steps):
    every E[.] is then the mean over the real steps only.

        L = -E[min(r A, clip(r, 1-eps, 1+eps) A)] + vf_coef * L_V - ent_coef * E[H]
    """
    log_ratio = (new_logp - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # [B]
    ratio = torch.exp(log_ratio)                                          # [B]
    pg_loss = _mean(torch.max(-advantages * ratio,
                              -advantages * torch.clamp(ratio, 1.0 - clip_coef, 1.0 + clip_coef)), mask)

    vf_err = (new_values - value_targets).square()                        # [B]
    if vf_clip is not None and old_values is not None:
        clipped = old_values + torch.clamp(new_values - old_values, -vf_clip, vf_clip)
        vf_err = torch.max(vf_err, (clipped - value_targets).square())
    vf_loss = 0.5 * _mean(vf_err, mask)

    entropy_mean = _mean(entropy, mask)
    loss = pg_loss + vf_coef * vf_loss - ent_coef * entropy_mean

    with torch.no_grad():
        approx_kl = _mean((ratio - 1.0) - log_ratio, mask)
        clip_frac = _mean(((ratio - 1.0).abs() > clip_coef).float(), mask)
        stats = torch.stack([loss, pg_loss, vf_loss, entropy_mean, approx_kl, clip_frac])
    return loss, stats


def _mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """E[x] over [B]; with a 0/1 mask [B], over the rows it keeps."""
    if mask is None:
        return x.mean()
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def ppo_loss(new_logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
             new_values: torch.Tensor, value_targets: torch.Tensor, entropy: torch.Tensor, *,
             clip_coef: float, vf_coef: float, ent_coef: float,
             old_values: torch.Tensor | None = None, vf_clip: float | None = None
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """``ppo_loss_terms`` with its diagnostics as python floats by name (one device sync)."""
    loss, stats = ppo_loss_terms(new_logp, old_logp, advantages, new_values, value_targets,
                                 entropy, clip_coef=clip_coef, vf_coef=vf_coef,
                                 ent_coef=ent_coef, old_values=old_values, vf_clip=vf_clip)
    return loss, dict(zip(STAT_NAMES, stats.tolist()))
