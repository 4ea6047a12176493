"""The network on one weights version, for whole train batches (the connector's values and
recomputed log-probs). Pure: numpy and onnxruntime, no torch.

MLP-only networks run the spec's numpy forward (``NumpyNet``, bound once per version).
A recurrent network runs step by step over the batch's chunks (``run_sequences``: numpy,
convolutions included). Other networks with convolutions run in onnxruntime on the
actor-critic graph with a value output (``OnnxWeightWriter(spec, with_value=True)``): a
numpy im2col convolution of a 2,048-frame 84x84 batch would need ~0.6 GB of scratch and
several seconds. Batches are fed in chunks of ``CHUNK_ROWS`` rows to bound memory either way.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rlinkd.client_lib.policy import has_conv, onnx_input_key, session
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.netonnx import OnnxWeightWriter
from rlinkd.client_lib.protocol.netops import DIST, STATE_OUT, VALUE
from rlinkd.client_lib.protocol.policy_spec import PolicySpec

CHUNK_ROWS = 1024


class BatchForward:
    """Dist inputs and values for one weights version. Built by the connector when the
    version it builds a batch with changes; ``run`` is called a few times per batch."""

    def __init__(self, spec: PolicySpec, flat: np.ndarray, writer: OnnxWeightWriter | None = None) -> None:
        self.spec = spec
        if writer is not None:
            self._session = session(writer.encode(flat), threads=1)
            self._names = {i.name: onnx_input_key(i.name) for i in self._session.get_inputs()}
        else:
            self._net = NumpyNet(spec, flat, (DIST, VALUE))
        self.onnx = writer is not None

    def run(self, obs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(dist inputs [N, D], values [N]) float32 for observation columns [N, ...]."""
        rows = len(next(iter(obs.values())))
        parts = [self._chunk({k: v[i:i + CHUNK_ROWS] for k, v in obs.items()})
                 for i in range(0, rows, CHUNK_ROWS)] or [self._chunk(obs)]
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))

    def _chunk(self, obs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        if self.onnx:
            feed = {name: np.ascontiguousarray(obs[key]) for name, key in self._names.items()}
            dist, value = self._session.run([DIST, VALUE], feed)
        else:
            out = self._net.run(obs)
            dist, value = out[DIST], out[VALUE]
        return dist.astype(np.float32, copy=False), value[:, 0].astype(np.float32, copy=False)

    def run_sequences(self, obs: Mapping[str, np.ndarray], index: np.ndarray, state0: np.ndarray,
                      starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A recurrent network over chunks: observation columns [N, ...], index [C, L] (rows,
        -1 padding: ``sequences.chunk_index``), state0 [C, S] (the state before each chunk's
        first step), starts [N] (1 where an episode begins: the state is zeroed first) ->
        (dist inputs [N, D], values [N], state after each step [N, S]), float32."""
        rows = len(starts)
        dist = np.zeros((rows, self.spec.dist_size), np.float32)
        values = np.zeros(rows, np.float32)
        after = np.zeros((rows, state0.shape[1]), np.float32)
        state = np.array(state0, np.float32)                                # [C, S]
        for t in range(index.shape[1]):
            live = np.flatnonzero(index[:, t] >= 0)                         # chunks still running
            r = index[live, t]                                              # [c] their rows
            state_in = state[live] * (1.0 - np.asarray(starts, np.float32)[r])[:, None]
            out = self._net.run({k: v[r] for k, v in obs.items()}, state_in)
            state[live] = after[r] = out[STATE_OUT]
            dist[r], values[r] = out[DIST], out[VALUE][:, 0]
        return dist, values, after

    def final_values(self, obs: Mapping[str, np.ndarray], state: np.ndarray) -> np.ndarray:
        """V(obs) [M] from the states [M, S] (a recurrent network's bootstrap values)."""
        return self._net.run(obs, state)[VALUE][:, 0].astype(np.float32, copy=False)


class ForwardCache:
    """The BatchForward of the newest version the connector used (one ONNX template per
    spec, built at most once)."""

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec
        onnx = has_conv(spec) and not spec.state_size  # (a recurrent network: numpy, by chunks)
        self._writer = OnnxWeightWriter(spec, with_value=True) if onnx else None
        self._seq: int | None = None
        self._forward: BatchForward | None = None

    def get(self, flat: np.ndarray, seq: int) -> BatchForward:
        if self._forward is None or seq != self._seq:
            self._forward, self._seq = BatchForward(self.spec, flat, self._writer), seq
        return self._forward
