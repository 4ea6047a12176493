"""The "native" backend: a spec's op list lowered onto the ``_native`` interpreter (native/net.c).

Like ``netnumpy`` it interprets ``netops`` (the one description of the maths), so it agrees
with numpy, ONNX and torch by construction of the same op list. Its test oracle is the numpy
interpreter (``client_lib.protocol.netnumpy.NumpyNet``: tests/unit/test_netnative.py), itself
held to ONNX and torch by tests/unit/test_networks.py; ``backend.choose_backend`` keeps one
of them per batch size in production. Every value becomes a float32 register [N, width]; observation leaves are
converted to float32 on the way in (what ``Cast`` does; an integer leaf's values are exact in
float32 up to 2**24, far beyond any Discrete or MultiDiscrete size). Images (``Conv``) are
not supported: ``NativeNet`` raises ``Unsupported`` and the role times the other backends.

A recurrent network (``State`` + ``Recurrent``: an LSTM or GRU cell, ``client_lib.protocol.
recurrent``) runs as a ``NativeStep``: "state_in" is one more input register, the cell one
instruction (``OP_LSTM`` / ``OP_GRU``, PyTorch's gate maths with sigmoid as
0.5 * (tanh(0.5 x) + 1)), and one call returns (dist [N, D], state_out [N, S]). ``NativeNet``
refuses a recurrent network (its output would need a state).

Built once per weights version (weights transposed into the constants, ~tens of us);
``run`` costs a few microseconds for a batch-1 MLP (numpy and onnxruntime: ~13-20 us, nearly
all of it per-call overhead).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol import netops as N

try:
    from rlinkd.daemon.inference import _native  # type: ignore[attr-defined]
except ImportError:  # (the optional extension was not compiled: see pyproject.toml)
    _native = None


class Unsupported(ValueError):
    """The network has an op the native interpreter lacks (a convolution), or no extension."""


def available() -> bool:
    return _native is not None


def native_module() -> Any:
    """The compiled extension, or None where it was not built."""
    return _native


class _Lowering:
    """Registers, constants and instructions, built op by op."""

    def __init__(self, params: Mapping[str, np.ndarray]) -> None:
        self.params = params
        self.reg: dict[str, int] = {}
        self.widths: list[int] = []
        self.consts: list[np.ndarray] = []
        self.n_consts = 0
        self.code: list[tuple[int, ...]] = []

    def register(self, name: str, width: int) -> int:
        self.reg[name] = len(self.widths)
        self.widths.append(width)
        return self.reg[name]

    def const(self, values: Any) -> int:
        arr = np.ascontiguousarray(values, np.float32).ravel()
        self.consts.append(arr)
        self.n_consts += arr.size
        return self.n_consts - arr.size

    def emit(self, op: int, out: int, x: int = 0, p0: int = 0, p1: int = 0, i0: int = 0, i1: int = 0,
             i2: int = 0) -> None:
        self.code.append((op, out, x, p0, p1, i0, i1, i2))

    def width(self, name: str) -> int:
        return self.widths[self.reg[name]]


def _lower(low: _Lowering, op: N.Op) -> None:
    """One op as instructions into a new register named ``op.out``."""
    c = _native
    if isinstance(op, (N.Cast, N.Flatten)):  # (inputs are float32 rows already)
        w = low.width(op.x)
        low.emit(c.OP_COPY, low.register(op.out, w), low.reg[op.x], i2=w)
    elif isinstance(op, N.Scale):
        w = low.width(op.x)
        low.emit(c.OP_SCALE, low.register(op.out, w), low.reg[op.x], low.const([op.factor]))
    elif isinstance(op, N.Normalize):
        w = low.width(op.x)
        low.emit(c.OP_NORMALIZE, low.register(op.out, w), low.reg[op.x], low.const(low.params[op.mean]),
                 low.const(low.params[op.std]))
    elif isinstance(op, N.OneHot):
        out = low.register(op.out, len(op.columns))
        low.emit(c.OP_ONEHOT, out, low.reg[op.x], low.const(op.columns), low.const(op.values))
    elif isinstance(op, N.Linear):
        weight = low.params[op.weight]  # [out, in]: stored transposed, [in, out]
        out = low.register(op.out, weight.shape[0])
        low.emit(c.OP_LINEAR, out, low.reg[op.x], low.const(weight.T), low.const(low.params[op.bias]))
    elif isinstance(op, N.Act):
        w = low.width(op.x)
        low.emit(c.OP_TANH if op.kind == "tanh" else c.OP_RELU, low.register(op.out, w), low.reg[op.x])
    elif isinstance(op, N.Concat):
        out, at = low.register(op.out, sum(low.width(x) for x in op.xs)), 0
        for x in op.xs:
            low.emit(c.OP_COPY, out, low.reg[x], i1=at, i2=low.width(x))
            at += low.width(x)
    elif isinstance(op, N.Slice):
        low.emit(c.OP_COPY, low.register(op.out, op.stop - op.start), low.reg[op.x], i0=op.start,
                 i2=op.stop - op.start)
    elif isinstance(op, N.Tile):
        row = low.params[op.param]
        low.emit(c.OP_TILE, low.register(op.out, row.shape[0]), p0=low.const(row))
    elif isinstance(op, N.Clip):
        w = low.width(op.x)
        low.emit(c.OP_CLIP, low.register(op.out, w), low.reg[op.x], low.const([op.low, op.high]))
    elif isinstance(op, N.Recurrent):
        _lower_cell(low, op)
    elif isinstance(op, N.Mask):
        w = low.width(op.x)
        low.emit(c.OP_MASK, low.register(op.out, w), low.reg[op.x], low.const([N.MASKED_LOGIT]),
                 i0=low.reg[op.mask], i1=op.start)
    else:
        raise Unsupported(f"the native backend has no {type(op).__name__}")


def _lower_cell(low: _Lowering, op: N.Recurrent) -> None:
    """The cell as one instruction: weights transposed, each followed by its bias, and a
    scratch register [N, 2 * G * H] for the gates."""
    c, p = _native, low.params
    gates = p[op.weight_ih].shape[0]  # G * H
    ih = low.const(np.concatenate([p[op.weight_ih].T.ravel(), p[op.bias_ih]]))
    hh = low.const(np.concatenate([p[op.weight_hh].T.ravel(), p[op.bias_hh]]))
    scratch = low.register(f"{op.out}.gates", 2 * gates)
    out = low.register(op.out, low.width(op.state))
    low.emit(c.OP_LSTM if op.cell == "lstm" else c.OP_GRU, out, low.reg[op.x], ih, hh,
             i0=low.reg[op.state], i1=op.size, i2=scratch)


def _program(spec: Any, flat: np.ndarray, outputs: tuple[str, ...]) -> tuple[Any, tuple[N.Input, ...], list[int]]:
    """(the ``_native.Program`` of ``outputs`` -- the first the output, a second the state
    output --, its observation inputs, the outputs' widths). Input registers: the observation
    leaves, then "state_in" for a recurrent network."""
    if _native is None:
        raise Unsupported("the _native extension is not built")
    ops = spec.net.needed(outputs)
    low = _Lowering(spec.split_flat(np.asarray(flat, np.float32)))
    inputs = tuple(op for op in ops if isinstance(op, N.Input))
    states = tuple(op for op in ops if isinstance(op, N.State))
    for inp in inputs:
        low.register(inp.out, math.prod(inp.shape))
    for state in states:
        low.register(state.out, state.width)
    for op in ops:
        if not isinstance(op, (N.Input, N.State)):
            _lower(low, op)
    consts = np.concatenate(low.consts) if low.consts else np.zeros(1, np.float32)
    program = _native.Program(np.asarray(low.code, np.int32).reshape(-1), consts, np.asarray(low.widths, np.int32),
                              len(inputs) + len(states), *(low.reg[o] for o in outputs))
    return program, inputs, [low.width(o) for o in outputs]


class NativeNet:
    """One weights version of a spec's network for ``outputs`` (one output), on ``_native``.
    ``Unsupported`` when the extension is missing or the network has an op it lacks."""

    def __init__(self, spec: Any, flat: np.ndarray, output: str = N.DIST) -> None:
        if spec.net.states((output,)):
            raise Unsupported(f"a recurrent network ({spec.recurrent}) runs as a NativeStep")
        self.program, self.inputs, (self.out_width,) = _program(spec, flat, (output,))

    def run(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        """float32 [N, out_width] for ``obs`` (leaf key -> [N, *shape], any numeric dtype)."""
        xs = tuple(np.ascontiguousarray(obs[inp.key], np.float32) for inp in self.inputs)
        n = len(xs[0]) if xs else 0
        out = np.empty((n, self.out_width), np.float32)
        self.program.run(n, xs, out)
        return out


class NativeStep:
    """One weights version of a recurrent spec's step on ``_native``: ``run(obs, state)`` ->
    (dist [N, D], state_out [N, S]) in one call. ``Unsupported`` as ``NativeNet``, and for a
    feed-forward network (it has no state)."""

    def __init__(self, spec: Any, flat: np.ndarray) -> None:
        if not spec.net.states((N.DIST,)):
            raise Unsupported("a feed-forward network runs as a NativeNet")
        self.program, self.inputs, (self.out_width, self.state_width) = _program(spec, flat, (N.DIST, N.STATE_OUT))

    def run(self, obs: Mapping[str, np.ndarray], state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dist, state_out) float32 for ``obs`` (as ``NativeNet.run``) and the states before
        the step [N, S] (zeros at an episode start; not checked for NaN, unlike NumpyNet's:
        the role feeds back what the step returned). ValueError on a misshapen state."""
        xs = tuple(np.ascontiguousarray(obs[inp.key], np.float32) for inp in self.inputs)
        n = len(xs[0]) if xs else len(state)
        if np.shape(state) != (n, self.state_width):
            raise ValueError(f"state must be [{n}, {self.state_width}], got {np.shape(state)}")
        dist = np.empty((n, self.out_width), np.float32)
        state_out = np.empty((n, self.state_width), np.float32)
        self.program.run(n, (*xs, np.ascontiguousarray(state, np.float32)), dist, state_out)
        return dist, state_out
