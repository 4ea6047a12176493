"""connector.vtrace: V-trace against hand-computed values, its on-policy reduction to GAE,
and the clipping of importance weights; the APPO pipeline replaces gae with vtrace."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.daemon.connector.gae import compute_gae
from rlinkd.daemon.connector.pipeline import pipeline_for
from rlinkd.daemon.connector.vtrace import compute_vtrace


def test_on_policy_vtrace_targets_are_gae_targets():
    rng = np.random.default_rng(0)
    n = 50
    rewards, values, next_values = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n)
    end = np.zeros(n, bool)
    end[[9, 29, 49]] = True
    terminated = end & (np.arange(n) != 29)
    next_values[:-1][~end[:-1]] = values[1:][~end[:-1]]
    _, vs = compute_vtrace(rewards, values, next_values, terminated, end, np.zeros(n), 0.9, 0.8)
    _, gae_targets = compute_gae(rewards, values, next_values, terminated, end, 0.9, 0.8)
    assert np.allclose(vs, gae_targets, atol=1e-5)


def test_two_steps_by_hand():
    # r = [1, 2], V = [0.5, 1.0], V(final) = 3.0 (not terminated), g = 0.5, lam = 1
    # pi/mu = [2.0 (clipped to 1), 0.5]:  rho = [1, 0.5], c = [1, 0.5]
    # delta_1 = 0.5 * (2 + 0.5*3 - 1) = 1.25               v_s1 = 1 + 1.25 = 2.25
    # delta_0 = 1 * (1 + 0.5*1 - 0.5) = 1.0                v_s0 = 0.5 + 1.0 + 0.5*1*(2.25 - 1) = 2.125
    # adv_0 = 1 * (1 + 0.5*2.25 - 0.5) = 1.625;  adv_1 = 0.5 * (2 + 0.5*3 - 1) = 1.25
    adv, vs = compute_vtrace(np.array([1.0, 2.0]), np.array([0.5, 1.0]), np.array([1.0, 3.0]),
                             np.array([False, False]), np.array([False, True]),
                             np.log([2.0, 0.5]), 0.5, 1.0)
    assert vs.tolist() == pytest.approx([2.125, 2.25]) and adv.tolist() == pytest.approx([1.625, 1.25])
    adv, vs = compute_vtrace(np.array([1.0, 2.0]), np.array([0.5, 1.0]), np.array([1.0, 3.0]),
                             np.array([False, True]), np.array([False, True]),
                             np.log([2.0, 0.5]), 0.5, 1.0)
    assert vs[1] == pytest.approx(1.0 + 0.5 * (2 - 1)) and adv[1] == pytest.approx(0.5 * (2 - 1))


def test_rho_clip_bounds_the_correction():
    big = compute_vtrace(np.array([1.0]), np.array([0.0]), np.array([0.0]), np.array([True]),
                         np.array([True]), np.array([5.0]), 0.9, 1.0, rho_bar=2.0)
    assert big[1][0] == pytest.approx(2.0) and big[0][0] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="six equal"):
        compute_vtrace(np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(3), 0.9, 1.0)


def test_the_appo_pipeline_uses_vtrace_instead_of_gae():
    names = ("observations", "columns", "old_logp", "values", "gae", "normalize_advantages")
    assert pipeline_for(names, "ppo") == names
    assert pipeline_for(names, "appo")[4] == "vtrace" and "gae" not in pipeline_for(names, "appo")
