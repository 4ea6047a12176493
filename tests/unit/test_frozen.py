"""Tier 1: frozen policies load from a checkpoint, an rlinkd ONNX file or a foreign model."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib.protocol.netonnx import IR_VERSION_OF_OPSET, OnnxWeightWriter, _outputs
from rlinkd.client_lib.protocol.spaces import Discrete
from rlinkd.daemon.errors import ConfigError
from rlinkd.daemon.frozen import check_frozen, load_frozen, onnx_flat_weights
from rlinkd.daemon.policies import PolicyDef
from rlinkd.daemon.config import PPOConfig
from tests.unit.test_export import CARTPOLE, spec_for, trained_flat, write_ckpt


def frozen(load_from, spec=None, name="opponent") -> PolicyDef:
    spec = spec or spec_for(*CARTPOLE)
    return PolicyDef(name, spec.obs_space, spec.act_space, spec, PPOConfig(), False, str(load_from))


def test_an_rlinkd_onnx_file_gives_the_actor_weights_and_zero_critic(tmp_path):
    spec = spec_for(*CARTPOLE)
    flat = trained_flat(spec, 3)
    path = tmp_path / "p.onnx"
    path.write_bytes(OnnxWeightWriter(spec).encode(flat))
    got = load_frozen(frozen(path, spec))
    assert got.onnx is None and got.flat is not None
    actor = set(spec.net.param_names(_outputs(False)))
    for name, part in spec.split_flat(got.flat).items():
        expected = spec.split_flat(flat)[name] if name in actor else 0.0
        np.testing.assert_array_equal(part, expected)
    check_frozen(frozen(path, spec))


def test_a_checkpoint_directory_gives_its_policy(tmp_path):
    ckpt, spec, flat = write_ckpt(tmp_path / "state", *CARTPOLE)
    got = load_frozen(frozen(ckpt.path, spec))
    np.testing.assert_allclose(got.flat, flat)
    other = spec_for(*CARTPOLE, hidden_sizes=(8,))
    with pytest.raises(ConfigError, match="trained for other spaces or another network"):
        check_frozen(frozen(ckpt.path, other))


FOREIGN_OPSET = 17
"""The opset of the foreign test model; its IR version comes from the table netonnx uses."""


def foreign_model(width: int, input_name: str = "observations") -> bytes:
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", width])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, width], np.ones(4 * width, np.float32))
    graph = helper.make_graph([helper.make_node("MatMul", [input_name, "w"], ["logits"])],
                              "foreign", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", FOREIGN_OPSET)])
    model.ir_version = IR_VERSION_OF_OPSET[FOREIGN_OPSET]  # pinned as netonnx does: the onnx
    return model.SerializeToString()  # package's default may be newer than onnxruntime reads


def test_the_foreign_model_has_the_pinned_ir_version():
    import onnx
    assert onnx.load_from_string(foreign_model(2)).ir_version == IR_VERSION_OF_OPSET[FOREIGN_OPSET]


def test_a_foreign_model_that_fits_is_served_as_is(tmp_path):
    path = tmp_path / "elsewhere.onnx"
    path.write_bytes(foreign_model(2))
    check_frozen(frozen(path))
    got = load_frozen(frozen(path))
    assert got.flat is None and got.onnx == path.read_bytes()
    assert onnx_flat_weights(spec_for(*CARTPOLE), got.onnx) is None


@pytest.mark.parametrize("data, pattern", [
    (foreign_model(3), r"output 'logits' has 3 numbers per row, .* needs 2"),
    (b"not a model", "not a valid ONNX model"),
])
def test_a_foreign_model_that_does_not_fit_is_a_config_error(tmp_path, data, pattern):
    path = tmp_path / "bad.onnx"
    path.write_bytes(data)
    with pytest.raises(ConfigError, match=pattern):
        check_frozen(frozen(path))


def test_inputs_must_match_the_leaves_of_a_dict_observation(tmp_path):
    from rlinkd.client_lib.protocol.spaces import Box, Dict
    obs = Dict({"a": Box([4]), "b": Box([1])})
    spec = spec_for(obs, Discrete(2))
    path = tmp_path / "one-input.onnx"
    path.write_bytes(foreign_model(2))
    with pytest.raises(ConfigError, match=r"inputs \['observations'\] do not match"):
        check_frozen(frozen(path, spec))


def test_a_missing_source_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"policies\.opponent\.load_from .* no such"):
        check_frozen(frozen(tmp_path / "nothing-here"))
