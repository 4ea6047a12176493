"""PolicySpec: layout, init, JSON, numpy forwards and distributions (vs torch and by hand)."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from rlinkd.client_lib.protocol import policy_spec
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.learner.model import ActorCritic

CARTPOLE = PolicySpec(Box((4,)), Discrete(2))
BOX = PolicySpec(Box((2, 3)), Box((2,), low=(-1.0, -2.0), high=(1.0, 2.0)), hidden_sizes=(16, 8),
                 activation="relu", log_std_init=-0.5)
SPECS = [CARTPOLE, BOX]


def random_flat(spec, seed=0):
    """Random weights with a non-identity normaliser (std kept positive)."""
    rng = np.random.default_rng(seed)
    flat = (0.5 * rng.standard_normal(spec.n_params())).astype(np.float32)
    params = spec.split_flat(flat)
    params["obs_std"][:] = rng.uniform(0.5, 2.0, spec.obs_size)
    return flat


def torch_model(spec, flat):
    model = ActorCritic(spec)
    model.load_flat(flat)
    return model


def test_cartpole_layout_order_and_size():
    assert CARTPOLE.param_layout() == [
        ("obs_mean", (4,)), ("obs_std", (4,)),
        ("pi.0.weight", (64, 4)), ("pi.0.bias", (64,)),
        ("pi.1.weight", (64, 64)), ("pi.1.bias", (64,)),
        ("pi.2.weight", (2, 64)), ("pi.2.bias", (2,)),
        ("vf.0.weight", (64, 4)), ("vf.0.bias", (64,)),
        ("vf.1.weight", (64, 64)), ("vf.1.bias", (64,)),
        ("vf.2.weight", (1, 64)), ("vf.2.bias", (1,)),
    ]
    # 8 + (4*64+64 + 64*64+64 + 64*2+2) + (4*64+64 + 64*64+64 + 64+1)
    assert CARTPOLE.n_params() == 8 + 4610 + 4545
    assert CARTPOLE.dist_size == 2


def test_box_layout_has_log_std_between_actor_and_critic():
    names = [name for name, _ in BOX.param_layout()]
    assert names.index("log_std") == names.index("pi.2.bias") + 1
    assert names[names.index("log_std") + 1] == "vf.0.weight"
    assert BOX.dist_size == 4


def test_split_flat_returns_views_and_checks_size():
    flat = np.zeros(CARTPOLE.n_params(), np.float32)
    CARTPOLE.split_flat(flat)["obs_std"][:] = 7.0
    np.testing.assert_array_equal(flat[4:8], 7.0)
    with pytest.raises(ValueError):
        CARTPOLE.split_flat(np.zeros(CARTPOLE.n_params() + 1, np.float32))


def test_init_flat_is_cleanrl_orthogonal():
    params = BOX.split_flat(BOX.init_flat(np.random.default_rng(3)))
    np.testing.assert_array_equal(params["obs_mean"], 0.0)
    np.testing.assert_array_equal(params["obs_std"], 1.0)
    np.testing.assert_allclose(params["log_std"], -0.5)
    w0 = params["pi.0.weight"]  # [16, 6]: orthonormal columns scaled by sqrt(2)
    np.testing.assert_allclose(w0.T @ w0, 2.0 * np.eye(6), atol=1e-5)
    head = params["pi.2.weight"]  # [2, 8]: orthonormal rows scaled by 0.01
    np.testing.assert_allclose(head @ head.T, 1e-4 * np.eye(2), atol=1e-9)
    critic_head = params["vf.2.weight"]  # [1, 8]: unit norm
    assert float(np.linalg.norm(critic_head)) == pytest.approx(1.0, abs=1e-6)
    for name, value in params.items():
        if name.endswith("bias"):
            np.testing.assert_array_equal(value, 0.0)


def test_json_round_trip_with_infinite_bounds():
    spec = PolicySpec(Box((3,)), Box((2,), low=(-math.inf, 0.0), high=(math.inf, 1.0)))
    text = json.dumps(spec.to_json(), allow_nan=False)
    assert json.loads(text)["act_space"]["low"] == [None, 0.0]
    assert PolicySpec.from_json(json.loads(text)) == spec
    assert PolicySpec.from_json(json.loads(json.dumps(BOX.to_json()))) == BOX


@pytest.mark.parametrize("make", [
    lambda: PolicySpec(Box((4,)), Discrete(2), activation="gelu"),
    lambda: PolicySpec(Box((4,)), Box((1,), low=1.0, high=0.0)),
    lambda: PolicySpec(Box((4,)), Box((2,), "int32", 0, 3)),
    lambda: PolicySpec(Box((4,)), Discrete(2), hidden_sizes=(0,)),
    lambda: PolicySpec(Box((4,)), Discrete(2), action_mask_key="mask"),
])
def test_invalid_specs_raise(make):
    with pytest.raises(ValueError):
        make()


@pytest.mark.parametrize("spec", SPECS)
def test_numpy_forwards_match_torch(spec):
    flat = random_flat(spec)
    model = torch_model(spec, flat)
    obs = np.random.default_rng(1).standard_normal((32, spec.obs_size)).astype(np.float32)
    with torch.no_grad():
        dist_t = model.dist_inputs(torch.from_numpy(obs)).numpy()
        value_t = model.value(torch.from_numpy(obs)).numpy()
    dist_np = spec.actor_forward(flat, obs)
    assert dist_np.shape == (32, spec.dist_size) and dist_np.dtype == np.float32
    np.testing.assert_allclose(dist_np, dist_t, atol=1e-5)
    np.testing.assert_allclose(spec.value_forward(flat, obs), value_t, atol=1e-5)


@pytest.mark.parametrize("spec", SPECS)
def test_numpy_log_prob_and_entropy_match_torch(spec):
    flat = random_flat(spec, seed=2)
    model = torch_model(spec, flat)
    obs = np.random.default_rng(3).standard_normal((64, spec.obs_size)).astype(np.float32)
    dist = spec.actor_forward(flat, obs)
    actions = spec.sample_actions(dist, np.random.default_rng(4))
    with torch.no_grad():
        logp_t, ent_t = model.log_prob_entropy(torch.from_numpy(obs), torch.from_numpy(actions))
    np.testing.assert_allclose(spec.log_prob(dist, actions), logp_t.numpy(), atol=1e-5)
    np.testing.assert_allclose(spec.entropy(dist), ent_t.numpy(), atol=1e-5)


def test_module_level_helpers_equal_methods():
    flat = random_flat(BOX)
    obs = np.random.default_rng(0).standard_normal((5, BOX.obs_size)).astype(np.float32)
    dist = policy_spec.actor_forward(BOX, flat, obs)
    np.testing.assert_array_equal(dist, BOX.actor_forward(flat, obs))
    np.testing.assert_array_equal(policy_spec.value_forward(BOX, flat, obs),
                                  BOX.value_forward(flat, obs))
    actions = policy_spec.sample_actions(BOX, dist, np.random.default_rng(1))
    np.testing.assert_array_equal(actions, BOX.sample_actions(dist, np.random.default_rng(1)))
    np.testing.assert_array_equal(policy_spec.log_prob(BOX, dist, actions),
                                  BOX.log_prob(dist, actions))
    np.testing.assert_array_equal(policy_spec.entropy(BOX, dist), BOX.entropy(dist))
    np.testing.assert_array_equal(policy_spec.greedy_actions(BOX, dist), BOX.greedy_actions(dist))


def test_discrete_distribution_by_hand():
    logits = np.array([[0.0, math.log(3.0)], [1000.0, 0.0]], np.float32)  # p = [.25, .75]
    np.testing.assert_allclose(CARTPOLE.log_prob(logits, np.array([1, 0])),
                               [math.log(0.75), 0.0], atol=1e-6)
    np.testing.assert_allclose(CARTPOLE.entropy(logits)[0],
                               -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), atol=1e-6)
    assert np.isfinite(CARTPOLE.entropy(logits)).all()
    np.testing.assert_array_equal(CARTPOLE.greedy_actions(logits), [[1], [0]])


def test_discrete_sampling_frequencies():
    logits = np.tile(np.array([[0.0, math.log(4.0)]], np.float32), (20000, 1))  # p = [.2, .8]
    actions = CARTPOLE.sample_actions(logits, np.random.default_rng(0))
    assert actions.dtype == np.float32 and actions.shape == (20000, 1)
    assert set(np.unique(actions)) == {0, 1}
    assert actions.mean() == pytest.approx(0.8, abs=0.012)  # ~4 standard errors


def test_box_distribution_by_hand_and_clipping():
    spec = PolicySpec(Box((1,)), Box((2,), low=(-1.0, -10.0), high=(1.0, 10.0)))
    dist = np.array([[0.0, 5.0, 0.0, math.log(2.0)]], np.float32)  # mean (0, 5), std (1, 2)
    # N(1; 0, 1) and N(5; 5, 2): -0.5 - log 2pi/2 + (-log 2 - log 2pi/2)
    expected = -0.5 - math.log(2.0) - math.log(2 * math.pi)
    assert spec.log_prob(dist, np.array([[1.0, 5.0]]))[0] == pytest.approx(expected, abs=1e-6)
    assert spec.entropy(dist)[0] == pytest.approx(1.0 + math.log(2.0) + math.log(2 * math.pi),
                                                  abs=1e-6)
    wide = np.tile(np.array([[0.0, 0.0, math.log(5.0), math.log(1.0)]], np.float32), (5000, 1))
    actions = spec.sample_actions(wide, np.random.default_rng(0))
    assert actions.dtype == np.float32 and actions.shape == (5000, 2)
    assert actions[:, 0].min() == -1.0 and actions[:, 0].max() == 1.0  # std 5: clipped often
    assert abs(actions[:, 1].mean()) < 0.06 and actions[:, 1].std() == pytest.approx(1.0, 0.05)
    np.testing.assert_array_equal(spec.greedy_actions(np.array([[3.0, -20.0, 0.0, 0.0]])),
                                  [[1.0, -10.0]])


def test_importing_policy_spec_does_not_load_torch():
    code = ("import sys, rlinkd.client_lib.protocol.policy_spec; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
