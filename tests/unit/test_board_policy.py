"""The shm client's numpy forward pass equals PolicySpec.actor_forward; ActionChooser."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib.policy import ActionChooser, BoardPolicy
from rlinkd.client_lib.protocol.columns import action_columns, native
from rlinkd.client_lib.protocol.distributions import ActionDist, categorical_one, components
from rlinkd.client_lib.protocol.masking import MASKED_LOGIT
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


def test_one_categorical_draw_matches_the_product_distribution():
    """categorical_one (a lone Discrete agent's draw on both sides) against ActionDist: the
    same frequencies, log-probabilities and mode; a masked index is never drawn."""
    dist = ActionDist(components(Discrete(4)))
    logits = np.array([[0.5, -1.0, 2.0, MASKED_LOGIT]], np.float32)
    rng = np.random.default_rng(0)
    draws = [categorical_one(logits[0].tolist(), float(u)) for u in rng.random(20_000)]
    counts = np.bincount([a for a, _ in draws], minlength=4) / len(draws)
    probs = np.exp(dist.log_prob(logits.repeat(4, 0), np.arange(4, dtype=np.float32)[:, None]))
    np.testing.assert_allclose(counts, probs, atol=0.01)
    assert counts[3] == 0.0 and categorical_one(logits[0].tolist(), 1.0)[0] == 2  # (rounding past the end)
    for a, logp in draws[:50]:
        assert logp == pytest.approx(float(dist.log_prob(logits, np.array([[a]], np.float32))[0]), abs=1e-5)
    assert categorical_one(logits[0].tolist(), None)[0] == 2


def test_a_lone_discrete_action_converts_like_the_general_path():
    for space in (Discrete(3), Discrete(5, start=-2)):
        chooser = ActionChooser(space, seed=0)
        for a in range(space.n):
            vec = np.array([a], np.float32)
            fast = chooser.to_env(vec)
            assert fast == native(action_columns(vec[None], space), space, 0) and type(fast) is int
