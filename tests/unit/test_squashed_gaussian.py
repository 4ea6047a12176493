"""The squashed Gaussian (SAC's Box actions): one network description, three forwards that
agree, numpy and torch distributions that agree, the change of variables checked against a
density computed by hand, bounds always respected, and the wire key that announces it."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlinkd.client_lib.links import server_config
from rlinkd.client_lib.policy import ActionChooser
from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.distributions import components, squash, unsquash
from rlinkd.client_lib.protocol.netops import LOG_STD_RANGE, Clip
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Dict, Discrete
from rlinkd.client_lib.transport import RLlinkError
from rlinkd.daemon.learner.model import ActorCritic
from tests.unit.test_networks import random_flat, random_obs, three_way

BOX = Box((2,), low=(-1.0, -2.0), high=(1.0, 4.0))
OBS = Box((3,))


def squashed(act=BOX) -> PolicySpec:
    return PolicySpec(OBS, act, hidden_sizes=(16, 16), box_dist="squashed_gaussian")


@pytest.mark.parametrize("act", [BOX, Dict((("pick", Discrete(3)), ("move", BOX)))],
                         ids=["box", "dict_discrete_box"])
def test_three_forwards_agree_and_the_log_std_is_clipped(act):
    spec = squashed(act)
    assert any(isinstance(op, Clip) for op in spec.ops())
    assert "log_std" not in dict(spec.param_layout())  # (state-dependent: from the head)
    (t_dist, _), (o_dist, _), (n_dist, _) = three_way(spec)
    np.testing.assert_allclose(o_dist, t_dist, atol=1e-5)
    np.testing.assert_allclose(n_dist, t_dist, atol=1e-5)
    big = spec.split_flat(random_flat(spec))  # a huge head: every log-std at a clip bound
    head = [name for name, _ in spec.param_layout() if name.startswith("pi.") and name.endswith(".bias")][-1]
    big[head][...] = 50.0
    flat = np.concatenate([v.reshape(-1) for v in big.values()])
    dist = spec.actor_forward(flat, random_obs(spec, 4))
    c = next(c for c in spec.action_components if c.kind == "squashed_gaussian")
    assert np.all(dist[:, c.dist + c.width:c.dist + 2 * c.width] == LOG_STD_RANGE[1])


def test_samples_stay_inside_the_bounds_and_greedy_is_the_squashed_mean():
    spec = squashed()
    dist = np.array([[0.0, 0.0, 3.0, 3.0], [40.0, -40.0, 0.0, 0.0]], np.float32)  # wide; saturated
    actions = spec.sample_actions(np.repeat(dist, 500, axis=0), np.random.default_rng(0))
    assert np.all(actions >= BOX.low) and np.all(actions <= BOX.high)
    np.testing.assert_allclose(spec.greedy_actions(dist)[0], [0.0, 1.0], atol=1e-6)  # the middle
    np.testing.assert_allclose(spec.greedy_actions(dist)[1], [1.0, -2.0], atol=1e-6)


def test_log_prob_is_the_change_of_variables_and_integrates_to_one():
    """1-D, bounds [-2, 4]: p_a(a) = N(u; m, s) / |da/du| with a = 1 + 3 tanh(u), by hand; the
    density integrates to 1 over the bounds."""
    spec = squashed(Box((1,), low=-2.0, high=4.0))
    m, log_s = 0.3, -0.4
    a = np.linspace(-1.999, 3.999, 20001)
    dist = np.tile(np.array([[m, log_s]], np.float32), (len(a), 1))
    u = np.arctanh((a - 1.0) / 3.0)
    by_hand = (np.exp(-0.5 * ((u - m) / math.exp(log_s)) ** 2) / (math.exp(log_s) * math.sqrt(2 * math.pi))
               / (3.0 * (1.0 - np.tanh(u) ** 2)))
    logp = spec.log_prob(dist, a[:, None].astype(np.float32))
    np.testing.assert_allclose(np.exp(logp), by_hand, rtol=2e-3)
    assert np.trapezoid(np.exp(logp.astype(np.float64)), a) == pytest.approx(1.0, abs=2e-3)


def test_numpy_and_torch_agree_and_rsample_gives_the_log_prob_of_its_draw():
    spec = squashed()
    flat, obs = random_flat(spec, 3), random_obs(spec, 300, 4)
    dist = spec.actor_forward(flat, obs)
    actions = spec.sample_actions(dist, np.random.default_rng(5))
    model = ActorCritic(spec)
    logp_t, ent_t = model.dist.log_prob_entropy(torch.from_numpy(dist), torch.from_numpy(actions))
    np.testing.assert_allclose(spec.log_prob(dist, actions), logp_t.numpy(), atol=2e-4)
    np.testing.assert_allclose(spec.entropy(dist), ent_t.numpy(), atol=1e-5)
    dist_t = torch.from_numpy(dist).requires_grad_(True)
    drawn, logp = model.dist.rsample(dist_t, torch.randn(300, 2, generator=torch.Generator().manual_seed(0)))
    np.testing.assert_allclose(logp.detach().numpy(), spec.log_prob(dist, drawn.detach().numpy()), atol=2e-3)
    (drawn.sum() + logp.sum()).backward()
    assert dist_t.grad is not None and dist_t.grad.abs().sum() > 0  # reparameterised
    c = spec.action_components[0]
    u = np.random.default_rng(1).normal(size=(50, 2))
    np.testing.assert_allclose(unsquash(c, squash(c, u)), u, atol=1e-6)
    np.testing.assert_allclose(model.dist.squash[c.dist](torch.from_numpy(u)).numpy(), squash(c, u), atol=1e-6)


def test_a_squashed_box_needs_finite_bounds_and_a_known_name():
    with pytest.raises(ValueError, match="finite"):
        components(Box((2,)), "squashed_gaussian")
    with pytest.raises(ValueError, match="box_dist"):
        components(BOX, "beta")
    assert PolicySpec.from_json(squashed().to_json()).box_dist == "squashed_gaussian"
    assert "box_dist" not in PolicySpec(Box((3,)), BOX).to_json()  # (older clients unchanged)


def test_set_config_announces_it_and_clients_sample_it():
    plain = codec.SetConfig(env_steps_per_sample=10, force_on_policy=False,
                            observation_space=Box((3,)).to_json(), action_space=BOX.to_json())
    assert "box_dist" not in codec.encode(plain).decode(errors="ignore")
    msg = codec.decode_body(codec.encode(codec.SetConfig(
        env_steps_per_sample=10, force_on_policy=False, observation_space=Box((3,)).to_json(),
        action_space=BOX.to_json(), box_dist="squashed_gaussian",
        policies={"red": {"observation_space": Box((3,)).to_json(), "action_space": BOX.to_json(),
                          "box_dist": "squashed_gaussian"}}))[8:])
    cfg = server_config(msg)
    assert cfg.policies["default"].box_dist == cfg.policies["red"].box_dist == "squashed_gaussian"
    chooser = ActionChooser(BOX, seed=0, box_dist=cfg.policies["red"].box_dist)
    wide = np.array([[0.0, 0.0, 2.0, 2.0]], np.float32)
    drawn = np.array([chooser.choose(wide, True)[0] for _ in range(300)])
    assert np.all(drawn >= BOX.low) and np.all(drawn <= BOX.high)
    assert np.mean(np.isin(drawn, [BOX.low, BOX.high])) < 0.5  # squashed, not clipped to a bound
    bad = codec.SetConfig(env_steps_per_sample=10, force_on_policy=False,
                          observation_space=Box((3,)).to_json(), action_space=BOX.to_json(),
                          box_dist="beta")
    with pytest.raises(RLlinkError, match="box_dist"):
        server_config(bad)


def test_an_exported_sidecar_names_the_squashed_distribution():
    from rlinkd.daemon.export import output_layout
    assert output_layout(PolicySpec(OBS, BOX)) == "mean_then_log_std"
    assert output_layout(squashed()) == [{"kind": "squashed_gaussian", "dist_columns": [0, 4],
                                          "action_columns": [0, 2]}]
