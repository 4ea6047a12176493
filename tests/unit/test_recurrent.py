"""The recurrent cell of the op list (`client_lib.protocol.recurrent`): torch, numpy and
onnxruntime agree on outputs and state over sequences with episode resets, the cells are
PyTorch's, feed-forward networks are untouched, and the paths that cannot carry a state
(the native backend's stateless NativeNet, a forward called without a state) refuse with a
clear error (the native step: test_netnative.py; the C client's cell: test_c_forward.py)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from rlinkd.client_lib.protocol import netops
from rlinkd.client_lib.protocol import recurrent as R
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.netonnx import OnnxWeightWriter, build_onnx_model
from rlinkd.client_lib.protocol.onnx_opsets import IR_VERSION_OF_OPSET
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Dict, Discrete
from rlinkd.daemon.inference import netnative
from rlinkd.daemon.learner import recurrent as TR
from rlinkd.daemon.learner.model import ActorCritic
from tests.unit.test_networks import onnx_feed, random_obs

OUTS = (netops.DIST, netops.VALUE, netops.STATE_OUT)
T, B = 12, 3


def spec_of(cell: str, **kw) -> PolicySpec:
    """A Dict observation (vector + Discrete) with a feed-forward encoder before the cell."""
    obs = Dict((("pos", Box((3,))), ("last", Discrete(4))))
    return PolicySpec(obs, Box((2,)), hidden_sizes=(16,), encoder_hidden_sizes=(8,),
                      recurrent=cell, recurrent_size=6, **kw)


def weights(spec: PolicySpec, seed: int = 0) -> np.ndarray:
    """Init plus noise large enough that the state visibly changes the outputs."""
    rng = np.random.default_rng(seed)
    return spec.init_flat(rng) + rng.normal(0.0, 0.3, spec.n_params()).astype(np.float32)


def episode_starts(seed: int = 5) -> np.ndarray:
    """[T, B] 0/1: every column starts at t = 0 and again at random steps."""
    starts = (np.random.default_rng(seed).random((T, B)) < 0.2).astype(np.float32)
    starts[0] = 1.0
    starts[4, 1] = 1.0
    return starts


def sequence_obs(spec: PolicySpec) -> list[dict[str, np.ndarray]]:
    return [random_obs(spec, B, seed=100 + t) for t in range(T)]


def stepwise(step, spec: PolicySpec, obs_seq, starts) -> dict[str, np.ndarray]:
    """Run `step(obs, state) -> outputs` step by step, the state zeroed at an episode start
    (what the acting side does): outputs stacked [T, B, *]."""
    state, got = np.zeros((B, spec.net.state_width), np.float32), []
    for t in range(T):
        state = np.where(starts[t][:, None] > 0, np.float32(0.0), state)
        out = step(obs_seq[t], state)
        state = out[netops.STATE_OUT]
        got.append(out)
    return {name: np.stack([g[name] for g in got]) for name in OUTS}


@pytest.mark.parametrize("cell", netops.CELLS)
def test_torch_numpy_onnx_agree_over_sequences_with_resets(cell):
    spec = spec_of(cell)
    flat, starts, obs_seq = weights(spec), episode_starts(), sequence_obs(spec)
    net = NumpyNet(spec, flat)
    numpy_out = stepwise(lambda o, s: net.run(o, s), spec, obs_seq, starts)
    session = ort.InferenceSession(OnnxWeightWriter(spec, with_value=True).encode(flat))
    onnx_out = stepwise(lambda o, s: dict(zip(OUTS, session.run(
        list(OUTS), {**onnx_feed(spec, o), netops.STATE_IN: s}))), spec, obs_seq, starts)
    model = ActorCritic(spec)
    model.load_flat(flat)
    stacked = {k: torch.from_numpy(np.stack([o[k] for o in obs_seq])) for k in obs_seq[0]}
    with torch.no_grad():
        garbage = torch.full((B, spec.net.state_width), 7.0)  # zeroed by the starts at t = 0
        torch_out = dict(zip(OUTS, (x.numpy() for x in model.run_sequence(
            stacked, garbage, torch.from_numpy(starts), OUTS))))
    for name in OUTS:
        np.testing.assert_allclose(onnx_out[name], numpy_out[name], atol=1e-5, rtol=0)
        np.testing.assert_allclose(torch_out[name], numpy_out[name], atol=1e-5, rtol=0)
    zero_state = net.run(obs_seq[-1], np.zeros((B, spec.net.state_width), np.float32))
    carried = starts[-1] == 0  # the state matters where no episode started: not a vacuous test
    assert np.abs(zero_state[netops.DIST][carried] - numpy_out[netops.DIST][-1][carried]).max() > 1e-3


@pytest.mark.parametrize("cell", netops.CELLS)
def test_torch_one_step_equals_the_sequence_form(cell):
    spec = spec_of(cell)
    model = ActorCritic(spec)
    model.load_flat(weights(spec, 1))
    obs = {k: torch.from_numpy(v) for k, v in random_obs(spec, B, seed=3).items()}
    state = torch.randn(B, spec.net.state_width, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        one = model.run(obs, OUTS, state)
        seq = model.run_sequence({k: v[None] for k, v in obs.items()}, state,
                                 torch.zeros(1, B), OUTS)
    for a, b in zip(one, seq):
        torch.testing.assert_close(a, b[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("cell", netops.CELLS)
def test_cells_are_pytorchs(cell):
    """The torch and numpy steps against nn.LSTMCell / nn.GRUCell with the same weights."""
    torch.manual_seed(0)
    ref = (torch.nn.LSTMCell if cell == "lstm" else torch.nn.GRUCell)(5, 4)
    w = (ref.weight_ih, ref.weight_hh, ref.bias_ih, ref.bias_hh)
    x, h, c = torch.randn(3, 5), torch.randn(3, 4), torch.randn(3, 4)
    state = torch.cat([h, c], dim=1) if cell == "lstm" else h
    with torch.no_grad():
        expected = torch.cat(ref(x, (h, c)), dim=1) if cell == "lstm" else ref(x, h)
        got = TR.STEPS[cell](x, state, w)
        arrays = [t.numpy() for t in w]
        got_np = R.STEPS[cell](x.numpy(), state.numpy(), arrays[0].T, arrays[1].T, *arrays[2:])
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(got_np, expected.numpy(), atol=1e-6, rtol=0)


def test_sequence_zeroes_the_state_where_an_episode_starts():
    w = tuple(torch.randn(*s, generator=torch.Generator().manual_seed(i))
              for i, s in enumerate(((9, 2), (9, 3), (9,), (9,))))
    x, state0 = torch.randn(3, 1, 2), torch.randn(1, 3)
    out = TR.sequence("gru", x, state0, torch.tensor([[0.0], [1.0], [0.0]]), w)
    torch.testing.assert_close(out[0], TR.gru_step(x[0], state0, w))
    torch.testing.assert_close(out[1], TR.gru_step(x[1], torch.zeros(1, 3), w))
    torch.testing.assert_close(out[2], TR.gru_step(x[2], out[1], w))


# ------------------------------------------------------------------------- the description
@pytest.mark.parametrize("cell", netops.CELLS)
def test_state_names_shapes_and_layout(cell):
    spec = spec_of(cell)
    assert spec.net.state_width == (12 if cell == "lstm" else 6)
    model = build_onnx_model(spec, with_value=True)
    shapes = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*model.graph.input, *model.graph.output)}
    assert shapes[netops.STATE_IN] == shapes[netops.STATE_OUT] == ["batch", spec.net.state_width]
    assert [o.name for o in model.graph.output] == list(OUTS)
    names = [name for name, _ in spec.param_layout()]
    gates = 4 if cell == "lstm" else 3
    assert dict(spec.param_layout())["rnn.weight_ih"] == (gates * 6, 16)  # 8 + 8 encoder columns
    assert names.index("obs.pos/mlp.0.bias") < names.index("rnn.weight_ih") < names.index("pi.0.weight")
    assert PolicySpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_feed_forward_specs_are_untouched():
    plain = PolicySpec(Box((3,)), Discrete(2))
    assert "recurrent" not in plain.to_json() and plain.net.state_width == 0
    assert not any(isinstance(op, (netops.State, netops.Recurrent)) for op in plain.ops())
    assert not any(name.startswith("rnn.") for name, _ in plain.param_layout())
    with pytest.raises(ValueError, match="recurrent must be"):
        PolicySpec(Box((3,)), Discrete(2), recurrent="rnn")


@pytest.mark.parametrize("cell", netops.CELLS)
def test_weight_writer_and_every_opset(cell):
    spec = spec_of(cell)
    flat, obs = weights(spec, 2), random_obs(spec, 4, seed=6)
    state = np.random.default_rng(7).normal(size=(4, spec.net.state_width)).astype(np.float32)
    assert OnnxWeightWriter(spec).encode(flat) == build_onnx_model(spec, flat).SerializeToString()
    expected = NumpyNet(spec, flat).run(obs, state)
    for opset in range(10, max(IR_VERSION_OF_OPSET) + 1):  # Slice: 10
        model = build_onnx_model(spec, flat, opset=opset)
        onnx.checker.check_model(model, full_check=True)
        got = ort.InferenceSession(model.SerializeToString()).run(
            [netops.DIST, netops.STATE_OUT], {**onnx_feed(spec, obs), netops.STATE_IN: state})
        np.testing.assert_allclose(got[0], expected[netops.DIST], atol=1e-5, rtol=0)
        np.testing.assert_allclose(got[1], expected[netops.STATE_OUT], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------- refusals
def test_a_forward_without_a_good_state_refuses():
    spec = spec_of("lstm")
    net, obs = NumpyNet(spec, weights(spec), (netops.DIST,)), random_obs(spec, 2)
    with pytest.raises(ValueError, match=r"recurrent: run needs a state \[N, 12\]"):
        net.run(obs)
    with pytest.raises(ValueError, match=r"shape \(2, 6\), expected \(2, 12\)"):
        net.run(obs, np.zeros((2, 6), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        net.run(obs, np.full((2, 12), np.nan, np.float32))
    with pytest.raises(ValueError, match="recurrent: run needs a state"):
        ActorCritic(spec).run({k: torch.from_numpy(v) for k, v in obs.items()}, (netops.DIST,))
    plain = PolicySpec(Box((3,)), Discrete(2))
    with pytest.raises(ValueError, match="feed-forward"):
        NumpyNet(plain, plain.init_flat(np.random.default_rng(0))).run(
            {"": np.zeros((2, 3), np.float32)}, np.zeros((2, 4), np.float32))


@pytest.mark.skipif(not netnative.available(), reason="the _native extension is not built")
@pytest.mark.parametrize("cell", netops.CELLS)
def test_the_native_stateless_net_refuses_a_recurrent_network(cell):
    spec = PolicySpec(Box((3,)), Discrete(2), recurrent=cell, recurrent_size=4)
    with pytest.raises(netnative.Unsupported, match=f"recurrent network \\({cell}"):
        netnative.NativeNet(spec, spec.init_flat(np.random.default_rng(0)))


def test_gradients_flow_through_the_chunk_and_stop_at_a_reset():
    spec = spec_of("lstm")
    model = ActorCritic(spec)
    obs_seq = sequence_obs(spec)
    stacked = {k: torch.from_numpy(np.stack([o[k] for o in obs_seq[:4]])) for k in obs_seq[0]}
    stacked["pos"].requires_grad_(True)
    starts = torch.zeros(4, B)
    starts[2, 0] = 1.0  # column 0 starts an episode at step 2
    value = model.run_sequence(stacked, torch.zeros(B, spec.net.state_width), starts, (netops.VALUE,))[0]
    value[3].sum().backward()
    grad = stacked["pos"].grad.abs().sum(dim=2)                          # [T, B]
    assert (grad[:2, 0] == 0).all() and (grad[:, 1:] > 0).all() and (grad[2:, 0] > 0).all()
    assert model.tensor("rnn.weight_hh").grad.abs().sum() > 0


def test_export_writes_the_state_contract(tmp_path):
    from rlinkd.daemon import export
    from tests.unit.test_export import write_ckpt
    spec = PolicySpec(Box((3,)), Discrete(2), recurrent="lstm", recurrent_size=5)
    _, _, flat = write_ckpt(tmp_path / "state", Box((3,)), Discrete(2), spec=spec)
    export.export_policy(tmp_path / "p.onnx", tmp_path / "state")
    meta = json.loads((tmp_path / "p.json").read_text())
    assert meta["state"] == {"cell": "lstm", "recurrent_size": 5, "input": "state_in",
                             "output": "state_out", "shape": ["batch", 10], "columns": ["h", "c"],
                             "reset": "zeros on the first step of every episode",
                             "max_seq_len": 20, "fragment_state_in": meta["state"]["fragment_state_in"]}
    assert PolicySpec.from_json(meta["policy_spec"]) == spec
    obs, state = np.ones((2, 3), np.float32), np.full((2, 10), 0.5, np.float32)
    got = ort.InferenceSession(str(tmp_path / "p.onnx")).run(None, {"onnx::Gemm_0": obs, "state_in": state})
    expected = NumpyNet(spec, flat, (netops.DIST,)).run({"": obs}, state)
    np.testing.assert_allclose(got[0], expected[netops.DIST], atol=1e-5, rtol=0)
    np.testing.assert_allclose(got[1], expected[netops.STATE_OUT], atol=1e-5, rtol=0)
    plain = tmp_path / "plain"
    write_ckpt(plain / "state", Box((3,)), Discrete(2))
    export.export_policy(plain / "p.onnx", plain / "state")
    assert "state" not in json.loads((plain / "p.json").read_text())


def test_state_rows_cover_every_started_chunk():
    assert [R.state_rows(t, 4) for t in (1, 3, 4, 5, 8, 9)] == [1, 1, 1, 2, 2, 3]


def test_ppo_config_makes_a_recurrent_spec_and_replay_algorithms_refuse_it():
    from rlinkd.daemon.config import ConfigError, load_config
    from rlinkd.daemon.policies import policy_defs
    ppo = [("ppo", "recurrent", "gru"), ("ppo", "recurrent_size", 8), ("ppo", "max_seq_len", 16)]
    spec = policy_defs(load_config(overrides=[("env", "id", "CartPole-v1"), *ppo],
                                   resolve_dirs=False))["default"].spec
    assert (spec.recurrent, spec.recurrent_size, spec.max_seq_len) == ("gru", 8, 16)
    assert PolicySpec.from_json(spec.to_json()) == spec
    for algorithm in ("dqn", "sac"):
        env = "Pendulum-v1" if algorithm == "sac" else "CartPole-v1"
        cfg = load_config(overrides=[("env", "id", env), ("learner", "algorithm", algorithm), *ppo],
                          resolve_dirs=False)
        with pytest.raises(ConfigError, match=r"^ppo\.recurrent = 'gru': " + algorithm):
            policy_defs(cfg)
    with pytest.raises(ConfigError, match=r"ppo\.recurrent: must be one of"):
        load_config(overrides=[("env", "id", "CartPole-v1"), ("ppo", "recurrent", "rnn")],
                    resolve_dirs=False)


def test_a_max_seq_len_the_connector_cannot_cut_on_its_grid_is_refused():
    """Half a batch slot (the connector's cut for long open runs) bounds max_seq_len: a
    longer sequence could be cut where no state was sent and start from zeros."""
    from rlinkd.daemon.config import ConfigError, batch_slot_rows, load_config
    from rlinkd.daemon.policies import policy_defs
    sampling = [("sampling", "train_batch_size", 64), ("sampling", "env_steps_per_sample", 32),
                ("ppo", "minibatch_size", 64)]
    longest = (2 * 64 + 32 + 1024) // 2

    def defs(max_seq_len: int, *extra):
        return policy_defs(load_config(overrides=[
            ("env", "id", "CartPole-v1"), *sampling, ("ppo", "recurrent", "lstm"),
            ("ppo", "max_seq_len", max_seq_len), *extra],
            resolve_dirs=False))

    cfg = load_config(overrides=[("env", "id", "CartPole-v1"), *sampling], resolve_dirs=False)
    assert batch_slot_rows(cfg.sampling) // 2 == longest
    assert defs(longest)["default"].spec.max_seq_len == longest
    with pytest.raises(ConfigError, match=rf"^ppo\.max_seq_len \({longest + 1}\) must not exceed {longest}"):
        defs(longest + 1)
    with pytest.raises(ConfigError, match=r"^ppo\.max_seq_len"):
        defs(longest + 1, ("learner", "algorithm", "appo"))
    feed_forward = defs(longest + 1, ("ppo", "recurrent", "none"))   # (unused without a cell)
    assert feed_forward["default"].spec.state_size == 0


def test_state_size_is_the_record_state_field():
    sizes = [PolicySpec(Box((3,)), Discrete(2), recurrent=cell, recurrent_size=6).state_size
             for cell in ("none", "lstm", "gru")]
    assert sizes == [0, 12, 6]
    from rlinkd.shm.records import StepLayout
    layout = StepLayout.flat(3, 1, 2, state_size=sizes[1])
    assert layout.dtype["state"].shape == (12,) and layout.record_bytes == 32 + 4 * (3 + 1 + 2 + 12)
