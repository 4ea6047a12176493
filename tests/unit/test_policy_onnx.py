"""ONNX export: agreement with torch, RLlib's gzip+base64 decode path, weight refresh."""

import base64
import gzip

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from rlinkd.client_lib.protocol import netonnx
from rlinkd.client_lib.protocol.policy_spec import OnnxWeightWriter, PolicySpec, build_onnx_model
from rlinkd.client_lib.protocol.spaces import Box
from rlinkd.daemon.collector.weights import set_state_payload
from tests.unit.test_policy_spec import BOX, CARTPOLE, random_flat, torch_model

BOX_FLAT_OBS = PolicySpec(Box((3,)), Box((1,), low=-2.0, high=2.0))
SPECS = [CARTPOLE, BOX, BOX_FLAT_OBS]


def torch_dist(spec, flat, obs):
    with torch.no_grad():
        return torch_model(spec, flat).dist_inputs(torch.from_numpy(obs)).numpy()


def random_obs(spec, n, seed=5):
    shape = spec.obs_space.shape
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


@pytest.mark.parametrize("spec", SPECS)
def test_model_is_valid_with_rllib_names(spec):
    model = build_onnx_model(spec)
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["onnx::Gemm_0"]
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch"
    assert [d.dim_value for d in dims[1:]] == list(spec.obs_space.shape)
    assert model.graph.output[0].name == "action_dist_inputs"
    assert (model.opset_import[0].version, model.ir_version) == (11, 6)
    layout_names = [name for name, _ in spec.param_layout()]
    assert [t.name for t in model.graph.initializer] == [
        n for n in layout_names if not n.startswith("vf.")]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("batch", [1, 7])
def test_onnxruntime_matches_torch(spec, batch):
    flat = random_flat(spec, seed=11)
    session = ort.InferenceSession(OnnxWeightWriter(spec).encode(flat))
    obs = random_obs(spec, batch)
    (out,) = session.run(None, {"onnx::Gemm_0": obs})
    assert out.shape == (batch, spec.dist_size)
    np.testing.assert_allclose(out, torch_dist(spec, flat, obs), atol=1e-5)


@pytest.mark.parametrize("spec", SPECS)
def test_set_state_payload_decodes_like_rllib_client(spec):
    flat = random_flat(spec, seed=12)
    payload = set_state_payload(OnnxWeightWriter(spec).encode(flat))
    assert isinstance(payload, str)
    # Exactly what RLlib's JSON-era client does with the SET_STATE payload:
    session = ort.InferenceSession(gzip.decompress(base64.b64decode(payload)))
    obs = random_obs(spec, 1)[0]
    logits = session.run(None, {"onnx::Gemm_0": np.array([obs], np.float32)})[0]
    np.testing.assert_allclose(logits, torch_dist(spec, flat, obs[None]), atol=1e-5)


def test_payload_is_deterministic():
    writer = OnnxWeightWriter(CARTPOLE)
    flat = random_flat(CARTPOLE)
    assert set_state_payload(writer.encode(flat)) == set_state_payload(writer.encode(flat.copy()))


@pytest.mark.parametrize("spec", [CARTPOLE, BOX])
def test_weight_refresh_reuses_graph_and_tracks_torch(spec, monkeypatch):
    builds = []
    real_build = netonnx.build_onnx_model
    monkeypatch.setattr(netonnx, "build_onnx_model",
                        lambda s, flat=None, **kw: builds.append(s) or real_build(s, flat, **kw))
    writer = OnnxWeightWriter(spec)
    model_before, nodes_before = writer.model, list(writer.model.graph.node)
    obs = random_obs(spec, 9)

    first, second = random_flat(spec, seed=1), random_flat(spec, seed=2)
    out_first = ort.InferenceSession(writer.encode(first)).run(None, {"onnx::Gemm_0": obs})[0]
    out_second = ort.InferenceSession(writer.encode(second)).run(None, {"onnx::Gemm_0": obs})[0]

    assert len(builds) == 1
    assert writer.model is model_before
    assert all(a is b for a, b in zip(writer.model.graph.node, nodes_before))
    assert len(writer.model.graph.node) == len(nodes_before)
    assert np.abs(out_first - out_second).max() > 1e-2
    np.testing.assert_allclose(out_second, torch_dist(spec, second, obs), atol=1e-5)


def test_encode_rejects_wrong_size():
    with pytest.raises(ValueError):
        OnnxWeightWriter(CARTPOLE).encode(np.zeros(CARTPOLE.n_params() - 1, np.float32))


def test_weight_refresh_does_not_leak_memory():
    """Regression: mutating one protobuf ModelProto per version leaked ~30 KB each."""
    import psutil
    spec = CARTPOLE
    writer = OnnxWeightWriter(spec)
    flat = spec.init_flat(np.random.default_rng(0))
    writer.encode(flat)
    before = psutil.Process().memory_info().rss
    for i in range(2000):
        writer.encode(flat + np.float32(i))
    grown_mb = (psutil.Process().memory_info().rss - before) / 2**20
    assert grown_mb < 8, f"RSS grew {grown_mb:.1f} MB over 2000 weight versions"
