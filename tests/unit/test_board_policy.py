"""The shm client's numpy forward pass equals PolicySpec.actor_forward; ActionChooser."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib.policy import ActionChooser, BoardPolicy
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Dict, Discrete


@pytest.mark.parametrize("act", [Discrete(3), Box((3,), low=-1.0, high=1.0)])
def test_board_policy_matches_actor_forward(act):
    spec = PolicySpec(Box((2, 3)), act, hidden_sizes=(16, 8), activation="relu")
    rng = np.random.default_rng(0)
    flat = spec.init_flat(rng) + rng.normal(size=spec.n_params()).astype(np.float32) * 0.1
    params = spec.split_flat(flat)
    params["obs_mean"][:] = rng.normal(size=6)
    params["obs_std"][:] = rng.uniform(0.5, 2.0, size=6)
    x = rng.normal(size=(7, 2, 3)).astype(np.float32)
    got = BoardPolicy(spec, flat, 3).dist_inputs(x)
    assert got.shape == (7, spec.dist_size) and got.dtype == np.float32
    np.testing.assert_allclose(got, spec.actor_forward(flat, x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(BoardPolicy(spec, flat, 3).dist_inputs({"": x}), got)


def test_action_chooser_gives_native_actions():
    act = Dict((("k", Discrete(3, start=1)), ("x", Box((1,), low=-1.0, high=1.0))))
    chooser = ActionChooser(act, seed=0)
    dist = np.array([[0.0, 20.0, 0.0, 0.25, np.log(1e-3)]], np.float32)
    action, logp = chooser.choose(dist, explore=False)
    np.testing.assert_array_equal(action, [1.0, 0.25])
    native = chooser.to_env(action)
    assert native["k"] == 2 and native["x"] == pytest.approx([0.25])
    sampled, logp_s = chooser.choose(dist, explore=True)
    assert sampled[0] == 1.0 and logp_s <= logp + 1e-6
