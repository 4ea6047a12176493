"""The native interpreter of the op list (daemon/inference/native/net.c via netnative): it agrees with
numpy (hence with ONNX and torch, tests/unit/test_networks.py) on every space family it supports,
and a recurrent network's step (LSTM, GRU) with numpy's over chained steps; its tanh is accurate,
and a malformed program is a ValueError, never a stray read."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib.protocol import netops
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Discrete
from rlinkd.daemon.inference import netnative
from rlinkd.daemon.inference.backend import choose_backend
from tests.unit.test_networks import ACT_FAMILIES, MASKED, OBS_FAMILIES, random_flat, random_obs, spec_for

pytestmark = pytest.mark.skipif(not netnative.available(), reason="the _native extension is not built")
CONV = {"image_small", "image_nature", "float_image", "dict_image_vector"}


def agree(spec, rows: int = 7) -> None:
    flat, obs = random_flat(spec), random_obs(spec, rows, 1)
    want = NumpyNet(spec, flat, (netops.DIST,)).run(obs)[netops.DIST]
    got = netnative.NativeNet(spec, flat).run(obs)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.abs(want).max() > 1e-3  # (not a comparison between zeros)


@pytest.mark.parametrize("obs_name", sorted(set(OBS_FAMILIES) - CONV))
def test_native_agrees_with_numpy_per_observation_family(obs_name):
    agree(spec_for(obs_name))


@pytest.mark.parametrize("act_name", list(ACT_FAMILIES))
def test_native_agrees_with_numpy_per_action_family(act_name):
    agree(spec_for("nested", act_name))


def test_native_agrees_on_masked_logits_and_batch_sizes():
    for rows in (1, 2, 17, 64):
        agree(MASKED, rows)


@pytest.mark.parametrize("obs_name", sorted(CONV))
def test_convolutions_are_unsupported_and_native_falls_back(obs_name):
    spec = spec_for(obs_name)
    with pytest.raises(netnative.Unsupported, match="ToNCHW"):
        netnative.NativeNet(spec, random_flat(spec))
    if obs_name == "image_small":  # (choose_backend times every candidate: one image is enough)
        (small, large), _ = choose_backend(spec, random_flat(spec), "native", lambda rows: random_obs(spec, rows))
        assert "native" not in (small, large)


def tanh_program(width: int):
    c = netnative._native
    code = np.array([c.OP_TANH, 1, 0, 0, 0, 0, 0, 0], np.int32)
    return netnative._native.Program(code, np.zeros(1, np.float32), np.array([width, width], np.int32), 1, 1)


def test_tanh_is_accurate_everywhere_and_keeps_nan():
    x = np.concatenate([np.linspace(-12, 12, 200_001), [0.0, -0.0, 0.25, -0.25, 1e-30, -1e-30, 9.0, -9.0,
                                                          3e38, -3e38, np.inf, -np.inf, np.nan]]).astype(np.float32)
    out = np.empty_like(x)
    tanh_program(1).run(len(x), (x,), out)
    want = np.tanh(x.astype(np.float64))
    finite = ~np.isnan(x)
    assert np.abs(out[finite] - want[finite]).max() < 3e-7
    assert np.isnan(out[~finite]).all() and np.abs(out[finite]).max() <= 1.0
    tiny = np.abs(x) < 0.25  # (small |x|: relative accuracy too, as tanhf has)
    nonzero = tiny & (x != 0)
    assert np.abs(out[nonzero] / want[nonzero] - 1).max() < 1e-6


@pytest.mark.parametrize("code, widths, consts, inputs, output", [
    ([1, 5, 0, 0, 0, 0, 0, 1], [2, 2], 1, 1, 1),       # out register past the end
    ([1, 0, 1, 0, 0, 0, 0, 1], [2, 2], 1, 1, 1),       # writes an input register
    ([1, 1, 0, 0, 0, 1, 0, 2], [2, 2], 1, 1, 1),       # copy reads past x's width
    ([5, 1, 0, 0, 4, 0, 0, 0], [2, 2], 5, 1, 1),       # linear weights past the constants
    ([2, 1, 0, -1, 0, 0, 0, 0], [2, 2], 1, 1, 1),      # negative constant offset
    ([99, 1, 0, 0, 0, 0, 0, 0], [2, 2], 1, 1, 1),      # unknown opcode
    ([1, 1, 0, 0, 0, 0, 0, 1, 7], [2, 2], 1, 1, 1),    # code not whole instructions
    ([6, 1, 0, 0, 0, 0, 0, 0], [2, 0], 1, 1, 1),       # zero-width register
    ([6, 1, 0, 0, 0, 0, 0, 0], [2, 2], 1, 3, 1),       # more inputs than registers
    ([6, 1, 0, 0, 0, 0, 0, 0], [2, 2], 1, 1, 2),       # output past the end
    ([10, 1, 0, 0, 0, 0, 1, 0], [2, 2], 1, 1, 1),      # mask columns past its register
    ([1, 1, 0, 0, 0, 0x7FFFFFFF, 0, 1], [2, 2], 1, 1, 1),  # an offset that overflows int32
    ([6, 1, 1, 0, 0, 0, 0, 0], [2, 2], 1, 1, 1),       # reads the register it writes
])
def test_a_malformed_program_is_refused(code, widths, consts, inputs, output):
    with pytest.raises(ValueError):
        netnative._native.Program(np.array(code, np.int32), np.zeros(consts, np.float32),
                                np.array(widths, np.int32), inputs, output)


def test_run_checks_its_buffers():
    prog = tanh_program(3)
    x, out = np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32)
    prog.run(2, (x,), out)
    for bad in [(2, (x[:1],), out), (1 << 40, (x,), out), (2**62, (x,), out),
                (2, (x.astype(np.float64),), out), (2, (x,), out[:1]), (2, (x,), out.astype(np.float64)),
                (2, (x, x), out), (2, [x], out), (-1, (x,), out)]:
        with pytest.raises((ValueError, TypeError, BufferError)):
            prog.run(*bad)
    with pytest.raises((ValueError, TypeError, BufferError)):
        prog.run(2, (x,), np.zeros((2, 3), np.float32)[:, ::-1])  # (not contiguous)



def test_a_program_is_initialised_once_and_runs_only_then():
    prog = tanh_program(3)
    code = np.array([netnative._native.OP_TANH, 1, 0, 0, 0, 0, 0, 0], np.int32)
    with pytest.raises(RuntimeError, match="once"):
        prog.__init__(code, np.zeros(1, np.float32), np.array([9, 9], np.int32), 0, 0)
    x, out = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    prog.run(2, (x,), out)  # (the failed second __init__ changed nothing)
    assert np.allclose(out, np.tanh(1.0))
    bare = netnative._native.Program.__new__(netnative._native.Program)
    with pytest.raises(RuntimeError, match="not initialised"):
        bare.run(0, (), np.zeros(0, np.float32))
    prog.run(0, (np.zeros((0, 3), np.float32),), np.zeros((0, 3), np.float32))  # (n = 0: nothing to do)


def recurrent_spec(cell: str, size: int = 16) -> PolicySpec:
    return PolicySpec(OBS_FAMILIES["nested"], Discrete(3), hidden_sizes=(32,), recurrent=cell,
                      recurrent_size=size)


@pytest.mark.parametrize("cell", netops.CELLS)
@pytest.mark.parametrize("rows", [1, 37])
def test_native_recurrent_step_agrees_with_numpy_over_chained_steps(cell, rows):
    """dist and state_out, from a nonzero state, five steps each fed the previous state out
    (numpy's chain and the native chain run side by side: errors do not get to compound
    unseen)."""
    spec = recurrent_spec(cell)
    flat = random_flat(spec)
    flat *= 4  # (weights large enough that gates saturate somewhere: both tanh branches run)
    oracle, step = NumpyNet(spec, flat, (netops.DIST,)), netnative.NativeStep(spec, flat)
    state = np.random.default_rng(rows).normal(size=(rows, spec.state_size)).astype(np.float32)
    mine = state.copy()
    for t in range(5):
        obs = random_obs(spec, rows, t)
        want = oracle.run(obs, state)
        dist, mine = step.run(obs, mine)
        assert dist.shape == want[netops.DIST].shape and mine.shape == state.shape
        assert dist.dtype == mine.dtype == np.float32
        np.testing.assert_allclose(dist, want[netops.DIST], atol=2e-5)
        np.testing.assert_allclose(mine, want[netops.STATE_OUT], atol=2e-5)
        state = want[netops.STATE_OUT]
    assert np.abs(state).max() > 1e-2 and np.abs(state - mine).max() < 2e-5


def test_native_step_and_net_each_refuse_the_other_kind_of_network():
    plain = spec_for("nested")
    with pytest.raises(netnative.Unsupported, match="feed-forward"):
        netnative.NativeStep(plain, random_flat(plain))
    spec = recurrent_spec("lstm", 4)
    with pytest.raises(netnative.Unsupported, match="NativeStep"):
        netnative.NativeNet(spec, random_flat(spec))


def test_native_step_checks_its_state_buffer():
    spec = recurrent_spec("gru", 4)
    step = netnative.NativeStep(spec, random_flat(spec))
    obs = random_obs(spec, 3)
    for bad in (np.zeros((2, 4), np.float32), np.zeros((3, 8), np.float32), np.zeros((3, 3), np.float32),
                np.zeros((4, 3), np.float32), np.zeros(12, np.float32), np.zeros((6, 2), np.float32)):
        with pytest.raises(ValueError, match=r"state must be \[3, 4\]"):  # (as numpy's step refuses them)
            step.run(obs, bad)
    dist, out = step.run(obs, np.zeros((3, 4)))  # (float64 zeros: converted)
    assert dist.shape == (3, 3) and out.shape == (3, 4)
    with pytest.raises(ValueError, match="state_out"):  # (a recurrent program needs both outputs)
        step.program.run(3, (*(np.ascontiguousarray(obs[i.key], np.float32) for i in step.inputs),
                             np.zeros((3, 4), np.float32)), dist)
    with pytest.raises(ValueError, match="state_out"):  # (a feed-forward program has no second)
        tanh_program(3).run(1, (np.zeros(3, np.float32),), np.zeros(3, np.float32), np.zeros(3, np.float32))


def cell_program(code: int, h: int, widths: list[int], state: int = 1, scratch: int = 3, consts: int = 0,
                 outputs: tuple[int, ...] = (2,)):
    """x = register 0 [N, 2], state = register ``state``, out = register 2, scratch ``scratch``;
    the cell's weights back to back from constant 0 (``consts`` floats in all, default exact)."""
    g = (4 if code == netnative._native.OP_LSTM else 3) * h
    need = consts or (2 + 1) * g + (h + 1) * g
    insn = np.array([code, 2, 0, 0, (2 + 1) * g, state, h, scratch], np.int32)
    return netnative._native.Program(insn, np.zeros(need, np.float32), np.array(widths, np.int32), 2, *outputs)


def test_a_malformed_cell_instruction_is_refused():
    c = netnative._native
    cell_program(c.OP_LSTM, 3, [2, 6, 6, 24])  # (well formed: the cases below break one thing each)
    cell_program(c.OP_GRU, 3, [2, 3, 3, 18], outputs=(2, 2))
    for code, h, widths, kw in [
        (c.OP_LSTM, 3, [2, 6, 6, 24], dict(consts=20)),        # weights past the constants
        (c.OP_LSTM, 3, [2, 6, 6, 23], {}),                      # scratch too narrow
        (c.OP_LSTM, 3, [2, 3, 3, 24], {}),                      # an LSTM state is 2H wide
        (c.OP_GRU, 3, [2, 3, 6, 18], {}),                       # out not the state's width
        (c.OP_GRU, 0, [2, 3, 3, 18], {}),                       # no hidden size
        (c.OP_GRU, 3, [2, 3, 3, 18], dict(state=2)),            # the state is the out register
        (c.OP_GRU, 3, [2, 3, 3, 18], dict(state=9)),            # state register past the end
        (c.OP_GRU, 3, [2, 3, 3, 18], dict(scratch=1)),          # scratch over an input (the state)
        (c.OP_GRU, 3, [2, 3, 3, 18], dict(scratch=2)),          # scratch is the out register
        (c.OP_GRU, 3, [2, 3, 3, 18], dict(outputs=(2, 7))),     # state output past the end
    ]:
        with pytest.raises(ValueError):
            cell_program(code, h, widths, **kw)
