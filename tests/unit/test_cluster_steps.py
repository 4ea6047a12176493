"""daemon.cluster.steps: the job's step agreement and its one-buffer weighted average,
checked with the all-reduce done by hand (a sum of the ranks' buffers)."""
import numpy as np
import pytest
import torch

from rlinkd.daemon.cluster.steps import (job_steps, pack_moments, pack_step, unpack_moments,
                                         unpack_step)
from rlinkd.daemon.learner.model import ObsNormalizer


@pytest.mark.parametrize("rows, expected", [([512, 512], 8), ([512, 65], 8), ([0, 65], 2),
                                            ([0, 0], 0), ([1], 1), ([], 0)])
def test_the_job_runs_the_most_minibatches_any_rank_has(rows, expected):
    assert job_steps(rows, 64) == expected


def test_weighted_average_is_the_mean_over_the_union_of_rows():
    rng = np.random.default_rng(0)
    per_row = [torch.tensor(rng.standard_normal((n, 5))) for n in (3, 7, 0)]
    shares = [pack_step(g.mean(0) if len(g) else torch.zeros(5, dtype=torch.float64),
                        torch.ones(2, dtype=torch.float64) * len(g), len(g), torch.tensor(True))
              for g in per_row]
    grad, stats = torch.empty(5, dtype=torch.float64), torch.empty(2, dtype=torch.float64)
    gate = unpack_step(sum(shares), grad, stats)
    torch.testing.assert_close(grad, torch.cat(per_row).mean(0), rtol=0, atol=1e-12)
    torch.testing.assert_close(stats, torch.full((2,), (9 + 49) / 10, dtype=torch.float64))
    assert gate.item() == 1.0


def test_one_rank_not_finite_closes_every_rank_gate():
    grad, stats = torch.ones(3), torch.zeros(1)
    summed = pack_step(grad, stats, 4, torch.tensor(True)) + pack_step(grad, stats, 4, torch.tensor(False))
    assert unpack_step(summed, grad.clone(), stats.clone()).item() == 0.0


def test_no_rows_anywhere_is_a_closed_gate_and_a_zero_gradient():
    grad, stats = torch.ones(3), torch.ones(1)
    summed = pack_step(torch.zeros(3), torch.zeros(1), 0, torch.tensor(True)) * 2
    assert unpack_step(summed, grad, stats).item() == 0.0
    assert grad.abs().sum().item() == 0.0 and stats.item() == 0.0


def test_merged_moments_fold_like_the_concatenated_observations():
    rng = np.random.default_rng(1)
    parts = [rng.standard_normal((n, 4)) * 3 + 1 for n in (50, 0, 20)]
    alone, job = ObsNormalizer(4), ObsNormalizer(4)
    alone.update(np.concatenate(parts))
    job.fold(*unpack_moments(sum(pack_moments(torch.from_numpy(p)) for p in parts)))
    assert job.count == alone.count == 70
    np.testing.assert_allclose(job.mean, alone.mean, rtol=1e-12)
    np.testing.assert_allclose(job.m2, alone.m2, rtol=1e-9)
