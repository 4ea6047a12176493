"""daemon.export: a checkpoint written by the real store becomes ONNX + a JSON description."""
from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from rlinkd.client_lib.protocol.policy_spec import ONNX_INPUT_NAME, ONNX_OUTPUT_NAME, PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Discrete, Space, space_from_json
from rlinkd.daemon import export
from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.config import PPOConfig, load_config, to_toml
from rlinkd.daemon.errors import CheckpointError, ExportError, UnknownPolicyError
from rlinkd.daemon.learner.learner import Learner
from rlinkd.daemon.version import PYPROJECT, package_version, pyproject_version
from rlinkd.daemon.wiring import make_policy_spec

CARTPOLE = (Box([4], low=[-4.8, -np.inf, -0.42, -np.inf], high=[4.8, np.inf, 0.42, np.inf]),
            Discrete(2))
IMAGE_BOX = (Box([2, 3], low=-1.0), Box([2], low=[-1.0, 0.0], high=[1.0, 2.0]))


def spec_for(obs: Space, act: Space, **ppo) -> PolicySpec:
    return make_policy_spec(load_config(None, [("ppo", k, v) for k, v in ppo.items()]), obs, act)


def trained_flat(spec: PolicySpec, seed: int) -> np.ndarray:
    """Random weights with a non-trivial normaliser: every parameter matters to the forward."""
    rng = np.random.default_rng(seed)
    flat = rng.normal(0.0, 0.5, spec.n_params()).astype(np.float32)
    params = spec.split_flat(flat)
    for leaf in spec.normalizers():
        params[leaf.std][...] = rng.uniform(0.5, 2.0, leaf.shape)
    assert spec.normalizers()  # every test space has a normalised leaf
    return flat


def learner_pt(spec: PolicySpec, flat: np.ndarray, seq_no: int) -> bytes:
    """learner.pt as the learner process writes it (daemon.learner.process)."""
    learner = Learner(spec, PPOConfig(), device="cpu", seed=0)
    learner.model.load_flat(flat)
    buf = io.BytesIO()
    torch.save({"learner": learner.state_dict(), "weights_seq_no": seq_no}, buf)
    return buf.getvalue()


def write_ckpt(state_dir, obs, act, *, seq_no=7, seed=0, with_policy_file=True, spec=None):
    """A checkpoint written by the real store; returns (checkpoint, spec, flat)."""
    spec = spec or spec_for(obs, act)
    flat = trained_flat(spec, seed)
    cfg = load_config(None, [("env", "observation_space", obs.to_json()),
                             ("env", "action_space", act.to_json())])
    files = {"learner.pt": learner_pt(spec, flat, seq_no), "config.toml": to_toml(cfg).encode()}
    if with_policy_file:
        files[export.POLICY_FILE] = json.dumps(export.policy_description(obs, act, spec)).encode()
    ckpt = store.write_checkpoint(store.checkpoints_dir(state_dir), files, {"weights_seq_no": seq_no})
    return ckpt, spec, flat


def run_onnx(path, obs: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path)).run([ONNX_OUTPUT_NAME], {ONNX_INPUT_NAME: obs})[0]


# ---------------------------------------------------------------- the exported pair
@pytest.mark.parametrize("spaces", [CARTPOLE, IMAGE_BOX], ids=["discrete", "box-2d-obs"])
def test_exported_onnx_matches_the_numpy_actor(tmp_path, spaces):
    obs_space, act_space = spaces
    _, spec, flat = write_ckpt(tmp_path / "state", obs_space, act_space)
    result = export.export_policy(tmp_path / "policy.onnx", tmp_path / "state")
    assert result.onnx_path == tmp_path / "policy.onnx" and result.weights_seq_no == 7
    obs = np.random.default_rng(1).normal(0, 2, (16, *obs_space.shape)).astype(np.float32)
    expected = spec.actor_forward(flat, obs)
    np.testing.assert_allclose(run_onnx(result.onnx_path, obs), expected, atol=1e-5, rtol=0)


def test_sidecar_round_trips_and_describes_the_onnx_file(tmp_path):
    obs_space, act_space = IMAGE_BOX
    ckpt, spec, _ = write_ckpt(tmp_path / "state", obs_space, act_space, seq_no=42)
    result = export.export_policy(tmp_path / "model.onnx", tmp_path / "state")
    assert result.sidecar_path == tmp_path / "model.json"
    meta = json.loads(result.sidecar_path.read_text())
    assert space_from_json(meta["observation_space"]) == obs_space  # None bounds come back as inf
    assert space_from_json(meta["action_space"]) == act_space
    assert PolicySpec.from_json(meta["policy_spec"]) == spec
    data = result.onnx_path.read_bytes()
    assert meta["onnx"] == {"file": "model.onnx", "sha256": hashlib.sha256(data).hexdigest(),
                            "input": ONNX_INPUT_NAME, "inputs": {ONNX_INPUT_NAME: ""},
                            "output": ONNX_OUTPUT_NAME,
                            "output_layout": "mean_then_log_std", "opset": 11, "ir_version": 6}
    assert meta["weights_seq_no"] == 42 and meta["policy"] == "default"
    assert meta["checkpoint"] == {"path": str(ckpt.path), "index": 1}
    assert meta["rlinkd_version"] == package_version() != "unknown"
    assert export.read_policy_description(meta, "sidecar") == (obs_space, act_space, spec)


def test_composite_observation_exports_one_onnx_input_per_leaf_and_the_mask(tmp_path):
    from rlinkd.client_lib.protocol.netops import input_name
    from rlinkd.client_lib.protocol.spaces import Dict, MultiBinary
    obs_space = Dict({"camera": Box([8, 8, 3], "uint8", 0, 255), "pos": Box([2], low=-1.0, high=1.0),
                      "action_mask": MultiBinary(3)})
    act_space = Discrete(3)
    cfg = load_config(None, [("env", "action_mask_key", "action_mask"), ("ppo", "hidden_sizes", [8])])
    spec = make_policy_spec(cfg, obs_space, act_space)
    _, spec, flat = write_ckpt(tmp_path / "state", obs_space, act_space, spec=spec)
    result = export.export_policy(tmp_path / "p.onnx", tmp_path / "state")
    meta = json.loads(result.sidecar_path.read_text())
    assert PolicySpec.from_json(meta["policy_spec"]) == spec and spec.action_mask_key == "action_mask"
    rng = np.random.default_rng(3)
    obs = {"camera": rng.integers(0, 256, (5, 8, 8, 3)).astype(np.uint8),
           "pos": rng.uniform(-1, 1, (5, 2)).astype(np.float32),
           "action_mask": np.int8([[1, 1, 1], [0, 1, 1], [1, 0, 0], [0, 0, 1], [1, 1, 0]])}
    session = ort.InferenceSession(str(result.onnx_path))
    feeds = {input_name(leaf.key, leaf.space.record_dtype): obs[leaf.key] for leaf in obs_space.leaves()}
    assert {i.name for i in session.get_inputs()} == set(feeds)
    got = session.run([ONNX_OUTPUT_NAME], feeds)[0]
    expected = spec.actor_forward(flat, obs)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-5)
    assert (got[obs["action_mask"] == 0] == np.float32(-1e9)).all()   # masked logits


def test_sidecar_path_rule(tmp_path):
    assert export.sidecar_path(tmp_path / "a.b.onnx") == tmp_path / "a.b.json"
    assert export.sidecar_path(tmp_path / "model") == tmp_path / "model.json"
    assert export.sidecar_path(tmp_path / "x.json") == tmp_path / "x.json.json"


def test_existing_files_are_replaced_and_no_temporary_file_stays(tmp_path):
    write_ckpt(tmp_path / "state", *CARTPOLE)
    (tmp_path / "p.onnx").write_bytes(b"old")
    (tmp_path / "p.json").write_text("old")
    export.export_policy(tmp_path / "p.onnx", tmp_path / "state")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "p.onnx", "state"]
    assert json.loads((tmp_path / "p.json").read_text())["onnx"]["file"] == "p.onnx"


# ---------------------------------------------------------------- which checkpoint
def test_newest_valid_checkpoint_is_exported_and_corrupt_ones_are_reported(tmp_path):
    state = tmp_path / "state"
    write_ckpt(state, *CARTPOLE, seq_no=1, seed=1)
    second, spec, flat = write_ckpt(state, *CARTPOLE, seq_no=2, seed=2)
    third, _, _ = write_ckpt(state, *CARTPOLE, seq_no=3, seed=3)
    (third.path / "learner.pt").write_bytes(b"tampered")
    warnings: list[str] = []
    result = export.export_policy(tmp_path / "p.onnx", state, warn=warnings.append)
    assert result.checkpoint == second.path and result.weights_seq_no == 2
    assert len(warnings) == 1 and "ckpt-000003" in warnings[0]
    obs = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(run_onnx(result.onnx_path, obs), spec.actor_forward(flat, obs), atol=1e-5)


def test_checkpoint_path_names_a_directory_or_a_file_in_one(tmp_path):
    first, _, _ = write_ckpt(tmp_path / "state", *CARTPOLE, seq_no=5)
    write_ckpt(tmp_path / "state", *CARTPOLE, seq_no=6)
    for path in (first.path, first.path / "manifest.json"):
        result = export.export_policy(tmp_path / "p.onnx", tmp_path / "elsewhere", checkpoint=path)
        assert result.checkpoint == first.path and result.weights_seq_no == 5


def test_checkpoint_without_policy_file_is_described_from_its_config(tmp_path):
    """Checkpoints written before policy.json existed still export (spaces from config.toml)."""
    ckpt, spec, flat = write_ckpt(tmp_path / "state", *IMAGE_BOX, with_policy_file=False)
    assert export.POLICY_FILE not in ckpt.manifest["files"]
    result = export.export_policy(tmp_path / "p.onnx", tmp_path / "state")
    meta = json.loads(result.sidecar_path.read_text())
    assert PolicySpec.from_json(meta["policy_spec"]) == spec
    obs = np.zeros((2, 2, 3), np.float32)
    np.testing.assert_allclose(run_onnx(result.onnx_path, obs), spec.actor_forward(flat, obs), atol=1e-5)


# ---------------------------------------------------------------- errors
def test_no_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match=r"no valid checkpoint in .*checkpoints"):
        export.export_policy(tmp_path / "p.onnx", tmp_path / "empty")
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        export.export_policy(tmp_path / "p.onnx", tmp_path, checkpoint=tmp_path / "ckpt-000009")
    (tmp_path / "not-a-ckpt").mkdir()
    with pytest.raises(CheckpointError, match="unreadable manifest"):
        export.export_policy(tmp_path / "p.onnx", tmp_path, checkpoint=tmp_path / "not-a-ckpt")
    assert not (tmp_path / "p.onnx").exists()


def test_unreadable_learner_state_or_mismatched_spec(tmp_path):
    obs_space, act_space = CARTPOLE
    wide = spec_for(obs_space, act_space, hidden_sizes=[8])
    ckpt, _, _ = write_ckpt(tmp_path / "a", obs_space, act_space, spec=wide)
    described = json.dumps(export.policy_description(obs_space, act_space, spec_for(*CARTPOLE)))
    bad = store.write_checkpoint(store.checkpoints_dir(tmp_path / "b"),
                                 {"learner.pt": (ckpt.path / "learner.pt").read_bytes(),
                                  export.POLICY_FILE: described.encode()}, {})
    with pytest.raises(CheckpointError, match=r"(?s)the model does not match the policy spec .*pi.0.weight"):
        export.load_policy(bad)
    garbage = store.write_checkpoint(store.checkpoints_dir(tmp_path / "c"),
                                     {"learner.pt": b"not a torch file",
                                      export.POLICY_FILE: described.encode()}, {})
    with pytest.raises(CheckpointError, match="unreadable learner state"):
        export.load_policy(garbage)


def test_malformed_policy_file(tmp_path):
    ckpt = store.write_checkpoint(store.checkpoints_dir(tmp_path),
                                  {export.POLICY_FILE: b'{"format_version": 1}'}, {})
    with pytest.raises(CheckpointError, match="malformed policy description"):
        export.load_policy(ckpt)


def test_unknown_policy_name_is_refused_naming_what_the_checkpoint_holds(tmp_path):
    write_ckpt(tmp_path / "state", *CARTPOLE)
    with pytest.raises(UnknownPolicyError, match=r"unknown policy 'walker'.*holds 'default'"):
        export.export_policy(tmp_path / "p.onnx", tmp_path / "state", policy="walker")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


def test_unwritable_output(tmp_path):
    write_ckpt(tmp_path / "state", *CARTPOLE)
    with pytest.raises(ExportError, match=r"cannot write .*missing/p.onnx: No such file"):
        export.export_policy(tmp_path / "missing" / "p.onnx", tmp_path / "state")
    (tmp_path / "dir.onnx").mkdir()
    with pytest.raises(ExportError, match=r"cannot write .*dir.onnx"):
        export.export_policy(tmp_path / "dir.onnx", tmp_path / "state")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.onnx", "state"]  # no temporaries


# ---------------------------------------------------------------- version
def test_version_falls_back_to_pyproject(tmp_path):
    assert package_version() == pyproject_version(PYPROJECT) != "unknown"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "9.8.7"\n')
    assert pyproject_version(tmp_path / "pyproject.toml") == "9.8.7"
    assert pyproject_version(tmp_path / "absent.toml") == "unknown"
    (tmp_path / "bad.toml").write_text("[project\n")
    assert pyproject_version(tmp_path / "bad.toml") == "unknown"
