"""compute_gae against hand-computed values and an independent explicit-sum reference."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinkd.daemon.connector.gae import compute_gae

# Three segments side by side, gamma=0.9, lam=0.5 (gamma*lam = 0.45):
#   A: 2 steps ending in termination (next_values[1]=3.0 must be ignored)
#        d1 = 2 - 1.0 = 1.0                 A1 = 1.0
#        d0 = 1 + 0.9*1.0 - 0.5 = 1.4       A0 = 1.4 + 0.45*1.0 = 1.85
#   B: 2 steps truncated, bootstrapped from V(final obs) = 4.0
#        d1 = 1 + 0.9*4.0 - 1.0 = 3.6       A1 = 3.6
#        d0 = 0 + 0.9*1.0 - 2.0 = -1.1      A0 = -1.1 + 0.45*3.6 = 0.52
#   C: 1-step cut fragment, bootstrapped from 2.0
#        d0 = -1 + 0.9*2.0 - 0.0 = 0.8      A0 = 0.8
REWARDS = [1.0, 2.0, 0.0, 1.0, -1.0]
VALUES = [0.5, 1.0, 2.0, 1.0, 0.0]
NEXT_VALUES = [1.0, 3.0, 1.0, 4.0, 2.0]
TERMINATED = [False, True, False, False, False]
SEGMENT_END = [False, True, False, True, True]
EXPECTED_ADV = [1.85, 1.0, 0.52, 3.6, 0.8]
EXPECTED_TARGETS = [2.35, 2.0, 2.52, 4.6, 0.8]


def test_gae_hand_computed_terminated_truncated_and_cut_segments():
    adv, targets = compute_gae(REWARDS, VALUES, NEXT_VALUES, TERMINATED, SEGMENT_END, 0.9, 0.5)
    assert adv.dtype == np.float32 and targets.dtype == np.float32
    np.testing.assert_allclose(adv, EXPECTED_ADV, rtol=1e-6)
    np.testing.assert_allclose(targets, EXPECTED_TARGETS, rtol=1e-6)


def test_gae_last_row_always_ends_a_segment():
    end = list(SEGMENT_END)
    end[-1] = False
    adv, _ = compute_gae(REWARDS, VALUES, NEXT_VALUES, TERMINATED, end, 0.9, 0.5)
    np.testing.assert_allclose(adv, EXPECTED_ADV, rtol=1e-6)


def test_gae_without_segment_end_recursion_crosses_rows():
    # Same rows with no boundary after row 1: A1 = 1.0 + 0.45 * A2(0.52) = 1.234.
    end = [False, False, False, True, True]
    adv, _ = compute_gae(REWARDS, VALUES, NEXT_VALUES, TERMINATED, end, 0.9, 0.5)
    np.testing.assert_allclose(adv[1], 1.234, rtol=1e-6)
    np.testing.assert_allclose(adv[0], 1.4 + 0.45 * 1.234, rtol=1e-6)


def test_gae_lambda_one_sums_discounted_deltas():
    adv, targets = compute_gae([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [9.0, 9.0, 9.0],
                               [False, False, True], [False, False, True], 0.5, 1.0)
    # V = 0 and next_values = 9 (taken as given, not read from the next row's value), and the
    # last row terminates: d = [1 + 0.5*9, 1 + 0.5*9, 1] and A_0 = d0 + 0.5 d1 + 0.25 d2.
    np.testing.assert_allclose(adv, [5.5 + 0.5 * 5.5 + 0.25, 5.5 + 0.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(targets, adv, rtol=1e-6)


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError):
        compute_gae([1.0, 2.0], [0.0], [0.0, 0.0], [False, False], [True, True], 0.99, 0.95)


def _reference_gae(r, v, nv, term, end, gamma, lam):
    """Explicit sum A_t = sum_k (gamma*lam)^k delta_{t+k} within each segment."""
    n = len(r)
    delta = [r[t] + gamma * nv[t] * (1.0 - term[t]) - v[t] for t in range(n)]
    adv = []
    for t in range(n):
        total, k = 0.0, t
        while True:
            total += (gamma * lam) ** (k - t) * delta[k]
            if end[k] or k == n - 1:
                break
            k += 1
        adv.append(total)
    return np.array(adv)


rows = st.integers(min_value=1, max_value=40)


@settings(max_examples=60, deadline=None)
@given(st.data(), rows, st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_gae_matches_explicit_sum_reference(data, n, gamma, lam):
    floats = st.floats(-10.0, 10.0, allow_nan=False)
    r = data.draw(st.lists(floats, min_size=n, max_size=n))
    v = data.draw(st.lists(floats, min_size=n, max_size=n))
    nv = data.draw(st.lists(floats, min_size=n, max_size=n))
    term = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    end = [e or t for e, t in zip(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)),
                                  term)]
    adv, targets = compute_gae(r, v, nv, term, end, gamma, lam)
    expected = _reference_gae(r, v, nv, term, end, gamma, lam)
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(targets, expected + np.array(v), rtol=1e-5, atol=1e-4)


def test_gae_module_does_not_import_torch():
    code = "import sys, rlinkd.daemon.connector.gae; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
