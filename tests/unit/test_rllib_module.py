"""daemon.collector.rllib_module: rlinkd's network under RLlib's DefaultPPOTorchRLModule names.

RLlib's client loads SET_STATE with ``strict=False``, so a wrong name would pass silently;
the names and shapes here are checked against those recorded from the real module of ray
2.49.0 and 2.60.0 (tests/fixtures/rllib_msgpack/ray-*/module.json, written by
bench/peers/rllib_msgpack_recorder.py), and the renamed weights must compute rlinkd's own
forward pass. The config pickle is only disassembled here, never loaded.
"""
from __future__ import annotations

import io
import json
import pickletools
from pathlib import Path

import numpy as np
import pytest

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Dict, Discrete, MultiDiscrete
from rlinkd.daemon.collector.rllib_module import config_pickle, rllib_net_error, rllib_state

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rllib_msgpack"
INF = float("inf")
CARTPOLE_OBS = Box([4], low=[-4.8, -INF, -0.418, -INF], high=[4.8, INF, 0.418, INF])
CARTPOLE_ACT = Discrete(2)


def spec_with(act=CARTPOLE_ACT, obs=CARTPOLE_OBS, **kw) -> PolicySpec:
    return PolicySpec(obs, act, **kw)


def trained_flat(spec: PolicySpec, seed: int = 0) -> np.ndarray:
    """Random weights with a non-trivial observation normaliser (as after training)."""
    rng = np.random.default_rng(seed)
    params = spec.split_flat(spec.init_flat(rng))
    params = {k: v + rng.normal(0, 0.3, v.shape) for k, v in params.items()}
    params["obs_std"] = rng.uniform(0.2, 3.0, params["obs_std"].shape)
    return np.concatenate([params[name].ravel() for name, _ in spec.param_layout()]).astype(np.float32)


def rllib_forward(state: dict, obs: np.ndarray, n_hidden: int, act: str = "tanh",
                  trunk: str = "actor") -> np.ndarray:
    """RLlib's default PPO module, written out: encoder MLP (Linear, act)*, then the head."""
    f = np.tanh if act == "tanh" else (lambda v: np.maximum(v, 0.0))
    x = obs.astype(np.float64)
    for i in range(n_hidden):
        pre = f"encoder.{trunk}_encoder.net.mlp.{2 * i}"
        x = f(x @ state[f"{pre}.weight"].T + state[f"{pre}.bias"])
    head = "pi" if trunk == "actor" else "vf"
    return x @ state[f"{head}.net.mlp.0.weight"].T + state[f"{head}.net.mlp.0.bias"]


@pytest.mark.parametrize("version", ["ray-2.49.0", "ray-2.60.0"])
def test_names_and_shapes_are_the_real_modules(version):
    recorded = json.loads((FIXTURES / version / "module.json").read_text())
    assert recorded["module"] == "DefaultPPOTorchRLModule"
    spec = spec_with(hidden_sizes=tuple(recorded["fcnet_hiddens"]),
                     activation=recorded["fcnet_activation"])
    state = rllib_state(spec, trained_flat(spec))
    assert {k: list(v.shape) for k, v in state.items()} == recorded["params"]
    assert set(recorded["inference_only_params"]) <= set(state)
    assert all(v.dtype == np.float32 for v in state.values())


@pytest.mark.parametrize("hidden,act", [((64, 64), "tanh"), ((32,), "relu"), ((16, 8, 4), "tanh")])
def test_renamed_weights_compute_rlinkds_forward(hidden, act):
    spec = spec_with(hidden_sizes=hidden, activation=act)
    flat = trained_flat(spec)
    obs = np.random.default_rng(1).normal(0, 2, (64, 4)).astype(np.float32)
    state = rllib_state(spec, flat)
    np.testing.assert_allclose(rllib_forward(state, obs, len(hidden), act),
                               spec.actor_forward(flat, obs), rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(rllib_forward(state, obs, len(hidden), act, "critic"),
                               spec.value_forward(flat, obs).reshape(-1, 1), rtol=1e-4, atol=2e-5)


def test_box_actions_send_the_log_std_as_the_heads_second_half():
    spec = spec_with(act=Box([2], low=-1.0, high=1.0), obs=Box([3]))
    flat = trained_flat(spec)
    obs = np.random.default_rng(2).normal(0, 1, (16, 3)).astype(np.float32)
    out = rllib_forward(rllib_state(spec, flat), obs, 2)
    np.testing.assert_allclose(out, spec.actor_forward(flat, obs), rtol=1e-4, atol=2e-5)
    assert out.shape == (16, 4)  # means, then log-stds (state-independent)
    np.testing.assert_allclose(out[:, 2:], np.broadcast_to(out[:1, 2:], (16, 2)), atol=1e-6)


@pytest.mark.parametrize("spec_kw,why", [
    ({"obs": Box([2, 2])}, "rank-1 float Box"),
    ({"obs": Box([4], dtype="int32")}, "rank-1 float Box"),
    ({"obs": Dict({"a": Box([2])})}, "rank-1 float Box"),
    ({"act": MultiDiscrete([2, 3])}, "Discrete"),
    ({"act": Discrete(3, start=1)}, "Discrete"),
    ({"encoder_hidden_sizes": (8,)}, "plain PPO MLP"),
    ({"hidden_sizes": ()}, "hidden layer"),
    ({"recurrent": "lstm", "recurrent_size": 4, "max_seq_len": 8}, "recurrent"),
    ({"recurrent": "gru", "recurrent_size": 4, "max_seq_len": 8}, "recurrent"),
])
def test_networks_without_the_default_module_form_are_named(spec_kw, why):
    assert why in (rllib_net_error(spec_with(**spec_kw)) or "")
    assert rllib_net_error(spec_with()) is None


def test_config_pickle_names_only_ppoconfig_spaces_and_numpy_array():
    """Disassembled, not loaded: which globals it would import and what it sets."""
    data = config_pickle(spec_with(hidden_sizes=(64, 64)), 32)
    ops = list(pickletools.genops(data))
    globals_ = {arg for op, arg, _ in ops if op.name == "GLOBAL"}
    assert globals_ == {"ray.rllib.algorithms.ppo.ppo PPOConfig", "gymnasium.spaces.box Box",
                        "gymnasium.spaces.discrete Discrete", "numpy array"}
    strings = [arg for op, arg, _ in ops if op.name == "BINUNICODE"]
    assert {"observation_space", "action_space", "rollout_fragment_length", "_model_config",
            "fcnet_hiddens", "fcnet_activation", "vf_share_layers", "head_fcnet_hiddens",
            "tanh"} <= set(strings)
    assert [op.name for op, _, _ in ops[-2:]] == ["BUILD", "STOP"]
    after = {arg: ops[i + 1][0].name for i, (op, arg, _) in enumerate(ops[:-1])
             if op.name == "BINUNICODE"}
    assert after["vf_share_layers"] == "NEWFALSE"  # separate actor and critic encoders
    assert after["head_fcnet_hiddens"] == "EMPTY_LIST"
    # Discrete(2), rollout_fragment_length, then fcnet_hiddens
    assert [arg for op, arg, _ in ops if op.name == "BININT"] == [2, 32, 64, 64]
    assert -4.8 in [arg for op, arg, _ in ops if op.name == "BINFLOAT"]
    pickletools.dis(data, out=io.StringIO())  # a well-formed opcode stream
