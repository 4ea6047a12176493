"""The shm client's numpy forward pass equals PolicySpec.actor_forward."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib.policy import BoardPolicy
from rlinkd.client_lib.protocol.policy_spec import PolicySpec


@pytest.mark.parametrize("kind", ["discrete", "box"])
def test_board_policy_matches_actor_forward(kind):
    bounds = {} if kind == "discrete" else {"action_low": (-1.0,) * 3, "action_high": (1.0,) * 3}
    spec = PolicySpec(obs_size=6, obs_shape=(2, 3), action_kind=kind, action_size=3,
                      hidden_sizes=(16, 8), activation="relu", **bounds)
    rng = np.random.default_rng(0)
    flat = spec.init_flat(rng) + rng.normal(size=spec.n_params()).astype(np.float32) * 0.1
    params = spec.split_flat(flat)
    params["obs_mean"][:] = rng.normal(size=6)
    params["obs_std"][:] = rng.uniform(0.5, 2.0, size=6)
    x = rng.normal(size=(7, 2, 3)).astype(np.float32)
    got = BoardPolicy(spec, flat, 3).dist_inputs(x)
    assert got.shape == (7, spec.dist_size) and got.dtype == np.float32
    np.testing.assert_allclose(got, spec.actor_forward(flat, x), rtol=1e-5, atol=1e-6)
