"""Networks chosen from the spaces: the torch, ONNX and numpy interpreters of one op list agree
for every space family; product distributions agree numpy vs torch; action masking."""
from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
import torch

from rlinkd.client_lib.protocol import netops
from rlinkd.client_lib.protocol.masking import MASKED_LOGIT
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.netonnx import OnnxWeightWriter, build_onnx_model
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import (Box, Dict, Discrete, MultiBinary, MultiDiscrete,
                                               Tuple)
from rlinkd.daemon.learner.model import ActorCritic

D = lambda *items: Dict(tuple(items))  # noqa: E731
IMAGE_SMALL = Box((10, 10, 4), "uint8", 0, 255)
IMAGE_NATURE = Box((84, 84, 3), "uint8", 0, 255)
VECTOR = Box((3,))
BOX_ACT = Box((2,), low=(-1.0, -2.0), high=(1.0, 2.0))

OBS_FAMILIES = {
    "flat_box": Box((4,)),
    "shaped_box": Box((2, 3)),
    "image_small": IMAGE_SMALL,
    "image_nature": IMAGE_NATURE,
    "float_image": Box((7, 6, 2)),
    "int_box": Box((3,), "int16", -5, 5),
    "bool_box": D(("b", Box((5,), "bool")), ("i", Box((2, 2), "int32", 0, 9))),
    "discrete_start": Discrete(5, start=-2),
    "multi_discrete": MultiDiscrete((3, 4), (1, 0)),
    "multi_binary": MultiBinary((2, 3)),
    "dict_image_vector": D(("camera", IMAGE_SMALL), ("speed", VECTOR)),
    "nested": Tuple((D(("a", Box((2,))), ("b", Discrete(3))),
                     Tuple((MultiBinary((2,)), Box((1,), "float64"))))),
}
ACT_FAMILIES = {
    "discrete": Discrete(3),
    "multi_discrete": MultiDiscrete((2, 4)),
    "multi_binary": MultiBinary((3,)),
    "box": BOX_ACT,
    "dict_discrete_box": D(("pick", Discrete(4)), ("move", BOX_ACT)),
    "nested": Tuple((D(("bits", MultiBinary((2,))), ("k", MultiDiscrete((3, 2)))), Box((1,)))),
}
MASKED = PolicySpec(D(("v", VECTOR), ("mask", MultiBinary((8,)))),
                    D(("a", Discrete(3)), ("m", MultiDiscrete((2, 3)))),
                    hidden_sizes=(16,), action_mask_key="mask")


def spec_for(obs_name: str, act_name: str = "discrete") -> PolicySpec:
    return PolicySpec(OBS_FAMILIES[obs_name], ACT_FAMILIES[act_name], hidden_sizes=(32, 16))


def leaf_values(space, n: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid values [n, *record_shape] in the record dtype."""
    if isinstance(space, Box):
        if space.is_float:
            return rng.standard_normal((n, *space.shape)).astype(np.float32)
        low, high = np.maximum(space.low_array, -100), np.minimum(space.high_array, 100)
        return rng.integers(low, high + 1, (n, *space.shape)).astype(space.record_dtype)
    if isinstance(space, Discrete):
        return space.start + rng.integers(0, space.n, n)
    if isinstance(space, MultiDiscrete):
        return np.asarray(space.start) + rng.integers(0, space.nvec, (n, len(space.nvec)))
    return rng.integers(0, 2, (n, *space.shape)).astype(np.int8)


def random_obs(spec: PolicySpec, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = {leaf.key: leaf_values(leaf.space, n, rng) for leaf in spec.obs_space.leaves()}
    if spec.action_mask_key:  # at least one legal choice per categorical component
        mask = obs[spec.action_mask_key]
        for c in spec.action_components:
            first = c.dist  # categorical components come first in MASKED's dist layout
            mask[np.arange(n), first + rng.integers(0, c.width, n)] = 1
    return obs


def random_flat(spec: PolicySpec, seed: int = 0) -> np.ndarray:
    """Init + noise, with non-identity normalisers and log-stds."""
    rng = np.random.default_rng(seed)
    flat = spec.init_flat(rng)
    flat += (0.05 * rng.standard_normal(flat.shape)).astype(np.float32)
    params = spec.split_flat(flat)
    for norm in spec.normalizers():
        params[norm.mean][...] = rng.normal(size=norm.shape)
        params[norm.std][...] = rng.uniform(0.5, 2.0, norm.shape)
    return flat


def onnx_feed(spec: PolicySpec, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {op.out: obs[op.key] for op in spec.net.inputs()}


def torch_outputs(spec, flat, obs):
    model = ActorCritic(spec)
    model.load_flat(flat)
    with torch.no_grad():
        dist, value = model.run({k: torch.from_numpy(v) for k, v in obs.items()},
                                (netops.DIST, netops.VALUE))
    return dist.numpy(), value.numpy()


def three_way(spec: PolicySpec, n: int = 5, seed: int = 0):
    flat, obs = random_flat(spec, seed), random_obs(spec, n, seed + 1)
    session = ort.InferenceSession(OnnxWeightWriter(spec, with_value=True).encode(flat))
    onnx_dist, onnx_value = session.run([netops.DIST, netops.VALUE], onnx_feed(spec, obs))
    np_out = NumpyNet(spec, flat).run(obs)
    return (torch_outputs(spec, flat, obs), (onnx_dist, onnx_value),
            (np_out[netops.DIST], np_out[netops.VALUE]))


@pytest.mark.parametrize("obs_name", list(OBS_FAMILIES))
def test_torch_onnx_numpy_agree_per_observation_family(obs_name):
    spec = spec_for(obs_name)
    (t_dist, t_value), (o_dist, o_value), (n_dist, n_value) = three_way(
        spec, n=2 if obs_name == "image_nature" else 6)
    assert t_dist.shape == (len(t_dist), spec.dist_size) and n_dist.dtype == np.float32
    scale = max(1.0, float(np.abs(t_value).max()))
    for dist, value in ((o_dist, o_value), (n_dist, n_value)):
        np.testing.assert_allclose(dist, t_dist, atol=1e-5)
        np.testing.assert_allclose(value, t_value, atol=1e-5 * scale)
    assert np.abs(t_value).max() > 1e-3  # the comparison is not between zeros


@pytest.mark.parametrize("act_name", list(ACT_FAMILIES))
def test_torch_onnx_numpy_agree_per_action_family(act_name):
    spec = spec_for("dict_image_vector", act_name)
    (t_dist, _), (o_dist, _), (n_dist, _) = three_way(spec)
    assert t_dist.shape[1] == spec.dist_size == spec.act_space.dist_size
    np.testing.assert_allclose(o_dist, t_dist, atol=1e-5)
    np.testing.assert_allclose(n_dist, t_dist, atol=1e-5)


@pytest.mark.parametrize("act_name", list(ACT_FAMILIES))
def test_numpy_and_torch_distributions_agree(act_name):
    spec = spec_for("flat_box", act_name)
    flat, obs = random_flat(spec, 3), random_obs(spec, 200, 4)
    dist = spec.actor_forward(flat, obs)
    dist[:, :] += np.random.default_rng(5).standard_normal(dist.shape).astype(np.float32)
    actions = spec.sample_actions(dist, np.random.default_rng(6))
    assert actions.shape == (200, spec.action_size) and actions.dtype == np.float32
    model = ActorCritic(spec)
    logp_t, ent_t = model.dist.log_prob_entropy(torch.from_numpy(dist), torch.from_numpy(actions))
    np.testing.assert_allclose(spec.log_prob(dist, actions), logp_t.numpy(), atol=1e-5)
    np.testing.assert_allclose(spec.entropy(dist), ent_t.numpy(), atol=1e-5)
    greedy = spec.greedy_actions(dist)
    assert (spec.log_prob(dist, greedy) >= spec.log_prob(dist, actions) - 1e-4).mean() > 0.9


def test_action_vector_and_dist_layout_for_dict_discrete_box():
    spec = spec_for("flat_box", "dict_discrete_box")
    assert spec.action_size == 3 and spec.dist_size == 4 + 2 + 2
    dist = np.array([[0, 0, 50, 0, 0.5, -1.5, math.log(1e-6), math.log(1e-6)]], np.float32)
    greedy = spec.greedy_actions(dist)
    np.testing.assert_array_equal(greedy, [[2, 0.5, -1.5]])
    sample = spec.sample_actions(np.repeat(dist, 100, axis=0), np.random.default_rng(0))
    assert (sample[:, 0] == 2).all() and np.allclose(sample[:, 1:], [0.5, -1.5], atol=1e-4)


def test_bernoulli_by_hand():
    spec = spec_for("flat_box", "multi_binary")
    dist = np.array([[0.0, math.log(3.0), -math.log(3.0)]], np.float32)  # p = .5, .75, .25
    logp = spec.log_prob(dist, np.array([[1, 1, 1]], np.float32))[0]
    assert logp == pytest.approx(math.log(0.5 * 0.75 * 0.25), abs=1e-6)
    h = lambda p: -(p * math.log(p) + (1 - p) * math.log(1 - p))  # noqa: E731
    assert spec.entropy(dist)[0] == pytest.approx(h(0.5) + 2 * h(0.75), abs=1e-6)
    draws = spec.sample_actions(np.repeat(dist, 20000, axis=0), np.random.default_rng(0))
    np.testing.assert_allclose(draws.mean(axis=0), [0.5, 0.75, 0.25], atol=0.015)


# ------------------------------------------------------------------------- ONNX specifics
@pytest.mark.parametrize("obs_name", list(OBS_FAMILIES))
def test_weight_writer_bytes_equal_a_fresh_build(obs_name):
    spec = spec_for(obs_name, "dict_discrete_box")
    flat = random_flat(spec, 9)
    for with_value in (False, True):
        fresh = build_onnx_model(spec, flat, with_value=with_value).SerializeToString()
        assert OnnxWeightWriter(spec, with_value=with_value).encode(flat) == fresh


def test_onnx_input_names_and_dtypes():
    spec = PolicySpec(D(("camera", IMAGE_SMALL), ("pos", Tuple((Discrete(2), VECTOR))),
                       ("mask", MultiBinary((3,)))), Discrete(3), action_mask_key="mask")
    model = build_onnx_model(spec)
    inputs = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    from onnx import TensorProto
    assert inputs == {"obs.camera": TensorProto.UINT8, "obs.pos.0": TensorProto.INT64,
                      "obs.pos.1": TensorProto.FLOAT, "obs.mask": TensorProto.INT8}
    assert [o.name for o in model.graph.output] == ["action_dist_inputs"]
    root_int = PolicySpec(Box((3,), "int16", -5, 5), Discrete(2))
    assert [i.name for i in build_onnx_model(root_int).graph.input] == ["obs"]
    flat = PolicySpec(Box((4,)), Discrete(2))
    assert [i.name for i in build_onnx_model(flat).graph.input] == ["onnx::Gemm_0"]


def test_actor_graph_has_no_critic_weights():
    spec = spec_for("dict_image_vector")
    names = {t.name for t in build_onnx_model(spec).graph.initializer}
    assert "pi.0.weight" in names and "obs.camera/conv.0.weight" in names
    assert not any(n.startswith("vf.") for n in names)


# ------------------------------------------------------------------------- architecture choice
def test_cnn_defaults_by_image_size():
    def convs(spec):
        return [shape for name, shape in spec.param_layout() if "conv." in name and
                name.endswith("weight")]
    nature = spec_for("image_nature")
    assert convs(nature) == [(32, 3, 8, 8), (64, 32, 4, 4), (64, 64, 3, 3)]
    assert dict(nature.param_layout())["obs/dense.weight"] == (512, 7 * 7 * 64)
    small = spec_for("image_small")
    assert convs(small) == [(16, 4, 3, 3), (32, 16, 3, 3)]
    assert dict(small.param_layout())["obs/dense.weight"] == (128, 6 * 6 * 32)
    tiny = PolicySpec(Box((3, 4, 1), "uint8", 0, 255), Discrete(2))
    assert convs(tiny) == [(16, 1, 3, 3)]


def test_cnn_is_configurable_and_must_fit():
    spec = PolicySpec(IMAGE_SMALL, Discrete(2), cnn_channels=(8, 4), cnn_kernels=(4, 2),
                      cnn_strides=(2, 1), cnn_dense=20)
    layout = dict(spec.param_layout())
    assert layout["obs/conv.0.weight"] == (8, 4, 4, 4) and layout["obs/conv.1.weight"] == (4, 8, 2, 2)
    assert layout["obs/dense.weight"] == (20, 3 * 3 * 4)  # 10 -4-> /2 = 4 -2-> 3
    with pytest.raises(ValueError, match="does not fit"):
        PolicySpec(IMAGE_SMALL, Discrete(2), cnn_channels=(8, 8), cnn_kernels=(8, 8))
    with pytest.raises(ValueError, match="one entry per"):
        PolicySpec(IMAGE_SMALL, Discrete(2), cnn_channels=(8,), cnn_kernels=(3, 3))


def test_encoders_are_shared_by_actor_and_critic():
    spec = spec_for("dict_image_vector")
    names = [name for name, _ in spec.param_layout()]
    assert sum(name.startswith("obs.camera/conv.0.weight") for name in names) == 1
    for head in (netops.DIST, netops.VALUE):
        assert "obs.camera/conv.0.weight" in spec.net.param_names((head,))


def test_encoder_hidden_sizes_add_a_vector_mlp():
    spec = PolicySpec(D(("v", VECTOR), ("d", Discrete(4))), Discrete(2),
                      encoder_hidden_sizes=(8,), hidden_sizes=(16,))
    layout = dict(spec.param_layout())
    assert layout["obs.v/mlp.0.weight"] == (8, 3) and layout["obs.d/mlp.0.weight"] == (8, 4)
    assert layout["pi.0.weight"] == (16, 16)
    (t_dist, _), (o_dist, _), (n_dist, _) = three_way(spec)
    np.testing.assert_allclose(o_dist, t_dist, atol=1e-5)
    np.testing.assert_allclose(n_dist, t_dist, atol=1e-5)


def test_integer_box_action_is_rejected():
    with pytest.raises(ValueError):
        PolicySpec(Box((4,)), Box((2,), "int32", 0, 3))


def test_json_round_trip_of_a_composite_spec():
    import json
    spec = PolicySpec(OBS_FAMILIES["nested"], ACT_FAMILIES["nested"], cnn_channels=(4,),
                      cnn_kernels=(2,), encoder_hidden_sizes=(5,), log_std_init=-0.5)
    again = PolicySpec.from_json(json.loads(json.dumps(spec.to_json(), allow_nan=False)))
    assert again == spec and again.param_layout() == spec.param_layout()
    assert PolicySpec.from_json(MASKED.to_json()) == MASKED


def test_flat_weights_round_trip_and_normalizer_setter():
    spec = spec_for("dict_image_vector", "dict_discrete_box")
    model = ActorCritic(spec)
    flat = random_flat(spec, 2)
    model.load_flat(flat)
    np.testing.assert_array_equal(model.flat_weights(), flat)
    model.set_normalizer("speed", np.full(3, 2.0), np.full(3, 4.0))
    params = spec.split_flat(model.flat_weights())
    np.testing.assert_array_equal(params["obs.speed_mean"], 2.0)
    np.testing.assert_array_equal(params["obs.speed_std"], 4.0)
    assert [n.key for n in spec.normalizers()] == ["speed"]  # the uint8 image is scaled
    trainable = {n for n, p in model.named_parameters()}
    assert "obs.speed_mean" not in {k.replace(":", ".") for k in trainable}


# ------------------------------------------------------------------------- action masking
def _masked_dist(flat, obs):
    return MASKED.actor_forward(flat, obs)


def test_masked_logits_are_replaced_in_every_backend():
    (t_dist, _), (o_dist, _), (n_dist, _) = three_way(MASKED, n=64)
    mask = random_obs(MASKED, 64, 1)["mask"].astype(bool)
    for dist in (t_dist, o_dist, n_dist):
        np.testing.assert_array_equal(dist[~mask], np.float32(MASKED_LOGIT))
        assert (dist[mask] > -100).all()


def test_masked_choices_are_never_sampled():
    flat = random_flat(MASKED, 1)
    obs = random_obs(MASKED, 1, 2)
    obs = {k: np.repeat(v, 20000, axis=0) for k, v in obs.items()}
    mask = obs["mask"][0].astype(bool)
    dist = _masked_dist(flat, obs)
    dist[:, mask] *= 0.0  # legal choices equally likely: a masked one would show up often
    actions = MASKED.sample_actions(dist, np.random.default_rng(0)).astype(int)
    offsets = [c.dist for c in MASKED.action_components]
    for col, first in enumerate(offsets):
        taken = np.unique(actions[:, col])
        assert mask[first + taken].all(), (col, taken, mask)
        assert len(taken) == mask[first:first + MASKED.action_components[col].width].sum()


def _head_bias_garbage(flat, columns):
    garbage = flat.copy()
    MASKED.split_flat(garbage)["pi.1.bias"][columns] += 1e3
    return garbage


def test_garbage_in_masked_raw_logits_changes_nothing():
    flat = random_flat(MASKED, 3)
    obs = random_obs(MASKED, 32, 4)
    obs["mask"][:] = obs["mask"][0]  # one mask for every row
    obs["mask"][:, [0, 3, 5]] = [0, 1, 0]
    obs["mask"][:, [1, 4, 6]] = 1
    masked_cols = np.flatnonzero(obs["mask"][0] == 0)
    legal_cols = np.flatnonzero(obs["mask"][0] == 1)
    dist = _masked_dist(flat, obs)
    actions = MASKED.sample_actions(dist, np.random.default_rng(0))
    garbage = _masked_dist(_head_bias_garbage(flat, masked_cols), obs)
    np.testing.assert_array_equal(garbage, dist)
    np.testing.assert_array_equal(MASKED.log_prob(garbage, actions), MASKED.log_prob(dist, actions))
    np.testing.assert_array_equal(MASKED.entropy(garbage), MASKED.entropy(dist))
    t_obs = {k: torch.from_numpy(v) for k, v in obs.items()}
    torch_results = []
    for weights in (flat, _head_bias_garbage(flat, masked_cols)):
        model = ActorCritic(MASKED)
        model.load_flat(weights)
        with torch.no_grad():
            torch_results.append((model.dist_inputs(t_obs),
                                  *model.log_prob_entropy(t_obs, torch.from_numpy(actions))))
    for plain, noisy in zip(*torch_results):
        assert torch.equal(plain, noisy)
    changed = _masked_dist(_head_bias_garbage(flat, legal_cols[:1]), obs)
    assert np.abs(changed - dist).max() > 1.0  # garbage in a legal logit does show


def test_no_gradient_reaches_masked_raw_logits():
    flat = random_flat(MASKED, 5)
    obs = random_obs(MASKED, 32, 6)
    obs["mask"][:] = [1, 0, 1, 0, 1, 1, 0, 1]
    model = ActorCritic(MASKED)
    model.load_flat(flat)
    t_obs = {k: torch.from_numpy(v) for k, v in obs.items()}
    actions = torch.from_numpy(MASKED.sample_actions(_masked_dist(flat, obs),
                                                     np.random.default_rng(0)))
    logp, ent, value = model.evaluate(t_obs, actions)
    (logp.sum() + ent.sum() + value.sum()).backward()
    head_bias = dict(model.named_parameters())["pi:1:bias"].grad
    head_weight = dict(model.named_parameters())["pi:1:weight"].grad
    masked = torch.tensor([1, 3, 6])
    assert (head_bias[masked] == 0).all() and (head_weight[masked] == 0).all()
    # column 4 is the only legal choice of its component (log-prob 0 whatever the logit)
    assert (head_bias[torch.tensor([0, 2, 5, 7])] != 0).all()


def test_mask_must_match_the_categorical_logits():
    with pytest.raises(ValueError):
        PolicySpec(D(("v", VECTOR), ("mask", MultiBinary((7,)))),
                   D(("a", Discrete(3)), ("m", MultiDiscrete((2, 3)))), action_mask_key="mask")
    with pytest.raises(ValueError):
        PolicySpec(D(("v", VECTOR)), Discrete(3), action_mask_key="mask")
