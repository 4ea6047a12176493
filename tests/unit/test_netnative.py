"""The native interpreter of the op list (daemon/inference/native/net.c via netnative): it agrees with
numpy (hence with ONNX and torch, tests/unit/test_networks.py) on every space family it supports,
its tanh is accurate, and a malformed program is a ValueError, never a stray read."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib.protocol import netops
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
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
