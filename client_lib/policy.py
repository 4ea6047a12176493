"""Client-side inference: turn an observation into an action without asking the server.

``OnnxPolicy`` runs the model a SET_STATE carries (base64 of gzip of ONNX) with
onnxruntime; ``BoardPolicy`` (shared memory) runs the same network with numpy from
the weights board. Both give distribution inputs; ``ActionChooser`` samples from
them while training (or takes the mode with ``explore=False``) and reports the
log-probability the learner needs. No torch anywhere here.
"""
from __future__ import annotations

import base64
import gzip
import hashlib

import numpy as np

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import SpaceSpec

ONNX_INPUT = "onnx::Gemm_0"


def decode_onnx(msg: codec.SetState) -> bytes:
    """ONNX bytes of a SET_STATE; checks ``onnx_sha256`` when the server sent it."""
    data = gzip.decompress(base64.b64decode(msg.onnx_file))
    if msg.onnx_sha256 and hashlib.sha256(data).hexdigest() != msg.onnx_sha256:
        raise ValueError("SET_STATE model does not match its onnx_sha256")
    return data


def observation_features(obs, space: SpaceSpec) -> np.ndarray:
    """One observation → the model input [1, *shape] float32 (Discrete: one-hot)."""
    if space.is_discrete:
        x = np.zeros((1, space.n), np.float32)
        x[0, int(obs)] = 1.0
        return x
    return np.asarray(obs, np.float32).reshape(1, *space.shape)


class OnnxPolicy:
    """An onnxruntime session on one weights version."""

    def __init__(self, msg: codec.SetState) -> None:
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(decode_onnx(msg), options,
                                            providers=["CPUExecutionProvider"])
        self.output = self.session.get_outputs()[0].name
        self.weights_seq_no = msg.weights_seq_no

    def dist_inputs(self, x: np.ndarray) -> np.ndarray:
        return self.session.run([self.output], {ONNX_INPUT: x})[0]


class BoardPolicy:
    """The actor's numpy forward pass on flat board weights (shared-memory clients).

    Layers are extracted once per weights version (transposed, contiguous), so one
    step costs a few small matmuls (~15 µs for 64x64), not a re-split of the vector.
    Matches ``PolicySpec.actor_forward`` exactly.
    """

    def __init__(self, spec: PolicySpec, flat: np.ndarray, weights_seq_no: int) -> None:
        self.spec, self.flat, self.weights_seq_no = spec, flat, weights_seq_no
        p = spec.split_flat(flat)
        self.mean, self.inv_std = p["obs_mean"].copy(), (1.0 / p["obs_std"]).astype(np.float32)
        n = len(spec.hidden_sizes) + 1
        self.layers = [(np.ascontiguousarray(p[f"pi.{i}.weight"].T), p[f"pi.{i}.bias"].copy())
                       for i in range(n)]
        self.log_std = p["log_std"].copy() if spec.is_box else None
        self.act = np.tanh if spec.activation == "tanh" else (lambda v: np.maximum(v, 0.0))

    def dist_inputs(self, x: np.ndarray) -> np.ndarray:
        h = (x.reshape(len(x), -1) - self.mean) * self.inv_std  # [N, obs_size]
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if i < len(self.layers) - 1:
                h = self.act(h)
        if self.log_std is not None:
            h = np.concatenate([h, np.broadcast_to(self.log_std, h.shape)], axis=1)
        return h.astype(np.float32, copy=False)


class ActionChooser:
    """Sampling/greedy action selection for one action space."""

    def __init__(self, act_space: SpaceSpec, seed: int | None = None) -> None:
        self.space = act_space
        self.rng = np.random.default_rng(seed)
        discrete = act_space.is_discrete
        self.spec = PolicySpec(
            obs_size=1, obs_shape=(1,), action_kind="discrete" if discrete else "box",
            action_size=act_space.n if discrete else act_space.flat_size,
            action_low=None if discrete else act_space.low,
            action_high=None if discrete else act_space.high)

    def choose(self, dist: np.ndarray, explore: bool) -> tuple[np.ndarray | np.integer, float]:
        """(action [A] or scalar int array, log-prob) from dist inputs [1, D]."""
        if self.space.is_discrete and explore:
            return self._sample_discrete(dist[0])
        actions = (self.spec.sample_actions(dist, self.rng) if explore
                   else self.spec.greedy_actions(dist))
        return actions[0], float(self.spec.log_prob(dist, actions)[0])

    def _sample_discrete(self, logits: np.ndarray) -> tuple[np.integer, float]:
        z = logits - logits.max()
        p = np.exp(z)
        p /= p.sum()
        a = int(np.searchsorted(np.cumsum(p), self.rng.random() * p.sum(), side="right"))
        a = min(a, len(p) - 1)
        return np.int64(a), float(z[a] - np.log(np.exp(z).sum()))

    def to_env(self, action: np.ndarray | np.integer):
        """The action in the form a gymnasium env expects."""
        if self.space.is_discrete:
            return int(action)
        return np.asarray(action, np.float32).reshape(self.space.shape)
