"""The network on one weights version, for whole train batches (the connector's values and
recomputed log-probs). Pure: numpy and onnxruntime, no torch.

MLP-only networks run the spec's numpy forward (``NumpyNet``, bound once per version).
Networks with convolutions run in onnxruntime on the actor-critic graph with a value output
(``OnnxWeightWriter(spec, with_value=True)``): a numpy im2col convolution of a 2,048-frame
84x84 batch would need ~0.6 GB of scratch and several seconds. Batches are fed in chunks of
``CHUNK_ROWS`` rows to bound memory either way.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rlinkd.client_lib.policy import has_conv, onnx_input_key, session
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.netonnx import OnnxWeightWriter
from rlinkd.client_lib.protocol.netops import DIST, VALUE
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


class ForwardCache:
    """The BatchForward of the newest version the connector used (one ONNX template per
    spec, built at most once)."""

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec
        self._writer = OnnxWeightWriter(spec, with_value=True) if has_conv(spec) else None
        self._seq: int | None = None
        self._forward: BatchForward | None = None

    def get(self, flat: np.ndarray, seq: int) -> BatchForward:
        if self._forward is None or seq != self._seq:
            self._forward, self._seq = BatchForward(self.spec, flat, self._writer), seq
        return self._forward
