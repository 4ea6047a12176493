"""numpy interpreter of the op list in `netops` (shared-memory clients, the connector).

`NumpyNet(spec, flat)` binds one weights version: parameters are split and pre-transposed
once, every op is compiled to a closure, and `run(obs)` is then a loop over closures (a
CartPole step costs a few small matmuls). Convolutions are im2col matmuls over a
`sliding_window_view` (no Python loop over pixels). No torch, no onnx.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from rlinkd.client_lib.protocol import netops as N
from rlinkd.client_lib.protocol import recurrent as R

Env = dict[str, np.ndarray]
Step = Callable[[Env], np.ndarray]


def _flatten(x: np.ndarray) -> np.ndarray:
    return x.reshape(x.shape[0], math.prod(x.shape[1:]))


def _conv(x: np.ndarray, w2: np.ndarray, b: np.ndarray, k: int, stride: int) -> np.ndarray:
    """x [N, C, H, W], w2 = weight [O, C*k*k] transposed -> [N, O, OH, OW] (valid padding)."""
    win = sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
    n, c, oh, ow = win.shape[:4]
    cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * k * k)
    return (cols @ w2 + b).reshape(n, oh, ow, -1).transpose(0, 3, 1, 2)


def _compile(op: N.Op, p: Mapping[str, np.ndarray]) -> Step:
    """A closure computing `op` from the environment of values (weights bound now)."""
    if isinstance(op, N.Cast):
        return lambda env: env[op.x].astype(np.float32)
    if isinstance(op, N.Scale):
        factor = np.float32(op.factor)
        return lambda env: env[op.x] * factor
    if isinstance(op, N.Normalize):
        mean, std = p[op.mean].copy(), p[op.std].copy()
        return lambda env: (env[op.x] - mean) / std
    if isinstance(op, N.OneHot):
        cols, vals = np.asarray(op.columns, np.intp), np.asarray(op.values, np.int64)
        return lambda env: (env[op.x][:, cols] == vals).astype(np.float32)
    if isinstance(op, N.Flatten):
        return lambda env: _flatten(env[op.x])
    if isinstance(op, N.ToNCHW):
        return lambda env: env[op.x].transpose(0, 3, 1, 2)
    if isinstance(op, N.Conv):
        w = p[op.weight]
        w2, b, k = np.ascontiguousarray(w.reshape(w.shape[0], -1).T), p[op.bias].copy(), w.shape[2]
        return lambda env: _conv(env[op.x], w2, b, k, op.stride)
    if isinstance(op, N.Linear):
        wt, b = np.ascontiguousarray(p[op.weight].T), p[op.bias].copy()
        return lambda env: env[op.x] @ wt + b
    if isinstance(op, N.Act):
        if op.kind == "tanh":
            return lambda env: np.tanh(env[op.x])
        return lambda env: np.maximum(env[op.x], np.float32(0.0))
    if isinstance(op, N.Concat):
        return lambda env: np.concatenate([env[x] for x in op.xs], axis=1)
    if isinstance(op, N.Slice):
        return lambda env: env[op.x][:, op.start:op.stop]
    if isinstance(op, N.Tile):
        row = p[op.param].copy()
        return lambda env: np.broadcast_to(row, (env[op.x].shape[0], row.shape[0]))
    if isinstance(op, N.Clip):
        low, high = np.float32(op.low), np.float32(op.high)
        return lambda env: np.clip(env[op.x], low, high)
    if isinstance(op, N.Mask):
        masked = np.float32(N.MASKED_LOGIT)
        return lambda env: np.where(env[op.mask][:, op.start:op.stop] != 0, env[op.x], masked)
    if isinstance(op, N.Recurrent):
        step = R.STEPS[op.cell]
        w_ih, w_hh = (np.ascontiguousarray(p[w].T) for w in (op.weight_ih, op.weight_hh))
        b_ih, b_hh = p[op.bias_ih].copy(), p[op.bias_hh].copy()
        return lambda env: step(env[op.x], env[op.state], w_ih, w_hh, b_ih, b_hh)
    raise TypeError(f"no numpy implementation of {type(op).__name__}")


class NumpyNet:
    """One weights version of a spec's network, compiled for `outputs`. A recurrent network
    (`recurrent`) also always outputs STATE_OUT and needs `state` in `run`.

    Built once per weights version (split + transposes + closures: tens of µs for an MLP);
    `run` is re-entrant but the object is not meant to be shared across threads.
    """

    def __init__(self, spec: Any, flat: np.ndarray,
                 outputs: tuple[str, ...] = (N.DIST, N.VALUE)) -> None:
        params = spec.split_flat(np.asarray(flat, np.float32))
        if spec.net.states(outputs) and N.STATE_OUT not in outputs:
            outputs = (*outputs, N.STATE_OUT)
        ops = spec.net.needed(outputs)
        self.outputs = outputs
        self.inputs = tuple(op for op in ops if isinstance(op, N.Input))
        self.state_width = sum(op.width for op in ops if isinstance(op, N.State))
        self._steps = [(op.out, _compile(op, params))
                       for op in ops if not isinstance(op, (N.Input, N.State))]

    def run(self, obs: Mapping[str, np.ndarray], state: np.ndarray | None = None
            ) -> dict[str, np.ndarray]:
        """Outputs (float32 [N, *]) for `obs`: leaf key -> [N, *record_shape] in record dtype
        (float leaves may also arrive flattened). KeyError on a missing leaf. A recurrent
        network reads `state` [N, state_width] (zeros at an episode start) and returns the
        next one as STATE_OUT; ValueError when it is missing, misshapen or not finite, or
        when a feed-forward network is given one."""
        env: Env = {}
        for inp in self.inputs:
            x = np.asarray(obs[inp.key])
            env[inp.out] = x.reshape(x.shape[0], *inp.shape) if x.ndim != 1 + len(inp.shape) else x
        if self.state_width or state is not None:
            env[N.STATE_IN] = self._state(state, env)
        for out, step in self._steps:
            env[out] = step(env)
        return {name: np.asarray(env[name], np.float32) for name in self.outputs}

    def _state(self, state: np.ndarray | None, env: Env) -> np.ndarray:
        if not self.state_width:
            raise ValueError("a state was given to a feed-forward network")
        if state is None:
            raise ValueError(f"this network is recurrent: run needs a state "
                             f"[N, {self.state_width}] (zeros at an episode start)")
        rows = len(next(iter(env.values()))) if env else len(state)
        return R.check_state(state, rows, self.state_width)
