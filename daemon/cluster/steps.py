"""The maths of a job's update, without a process group (pure functions on tensors).

Exactness: a rank's SGD step contributes its minibatch's mean gradient ``g_r`` over its
``b_r`` rows; the job steps with ``sum_r b_r g_r / sum_r b_r``, the mean gradient over the
union of the ranks' minibatches. PPO's loss is a mean over rows, so this equals one learner
stepping on that union: the job's update is one learner's update on the concatenated batches,
its minibatches the unions of the ranks' minibatches.

Agreeing the minibatch count: before an update the ranks exchange their row counts (one
all-reduce of a world-size vector). Rank r plans its own ``K_r = ceil(n_r / B)`` minibatches
per epoch (``minibatch.epoch_plan``); the job runs ``K = max_r K_r`` steps per epoch; a rank
out of minibatches (or without rows at all) joins the remaining steps with a zero gradient of
weight 0. Every rank so runs the same collectives in the same order, and the job's weights,
optimizer state and normaliser statistics stay bit-identical across ranks.

One buffer per SGD step: ``[b_r * grad (P), b_r * stats (S), b_r, not_finite]`` summed over
the ranks by ONE all-reduce; a step where any rank's loss was not finite is skipped by all.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def job_steps(rows_per_rank: Sequence[int], minibatch_size: int) -> int:
    """SGD steps per epoch of the job's update: the most minibatches any rank has (0 when no
    rank has rows: then there is no update)."""
    return max(-(-int(n) // minibatch_size) for n in rows_per_rank) if rows_per_rank else 0


def replay_steps(due_per_rank: Sequence[int], rows_per_rank: Sequence[int], to_publish: int) -> int:
    """Gradient steps of a replay job's round: the most steps any rank's data makes due, at
    most up to the next publication (so every rank publishes after the same step); 0 when no
    rank has rows to sample (every buffer below its learning start)."""
    if not any(rows_per_rank):
        return 0
    return max(0, min(max(due_per_rank), to_publish))


def pack_step(grad: torch.Tensor, stats: torch.Tensor, rows: float | torch.Tensor,
              finite: torch.Tensor) -> torch.Tensor:
    """One rank's share of a step [P + S + 2]: its gradient [P] and diagnostics [S] (means over
    its ``rows``) weighted by ``rows``, then ``rows`` and 1 - ``finite`` (0-dim, 1 = its loss
    was finite)."""
    weight = torch.as_tensor(rows, device=grad.device).to(grad.dtype).reshape(1)
    not_finite = (1.0 - finite.to(grad.dtype)).reshape(1)
    return torch.cat([grad * weight, stats.to(grad.dtype) * weight, weight, not_finite])


def unpack_step(summed: torch.Tensor, grad: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """From the sum of every rank's ``pack_step``: the job's mean gradient into ``grad`` and
    mean diagnostics into ``stats`` (in place; zeros when no rank had rows); returns the 0-dim
    gate, 1.0 when every rank's loss was finite and some rank had rows, else 0.0."""
    p, s = grad.numel(), stats.numel()
    rows, not_finite = summed[p + s], summed[p + s + 1]
    scale = torch.where(rows > 0, 1.0 / rows.clamp(min=1e-30), torch.zeros_like(rows))
    grad.copy_(summed[:p] * scale)
    stats.copy_(summed[p:p + s] * scale)
    return ((rows > 0) & (not_finite == 0)).to(grad.dtype)


def pack_moments(x: torch.Tensor) -> torch.Tensor:
    """A rank's observations [N, D] as [1 + 2D] float64: N, the column sums, the sums of
    squares (summed over the ranks by one all-reduce)."""
    x = x.to(torch.float64)
    count = torch.tensor([float(len(x))], dtype=torch.float64, device=x.device)
    return torch.cat([count, x.sum(dim=0), (x * x).sum(dim=0)])


def unpack_moments(summed: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(N, mean [D], sum of squared deviations from the mean [D]) of the union of the ranks'
    observations, from the sum of their ``pack_moments`` (mean and m2 zero when N is 0)."""
    d = (summed.numel() - 1) // 2
    n = int(summed[0].item())
    if n == 0:
        return 0, torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64)
    total, squares = summed[1:1 + d].cpu(), summed[1 + d:].cpu()
    mean = total / n
    return n, mean, (squares - n * mean * mean).clamp(min=0.0)
