"""Client-side inference: turn an observation into an action without asking the server.

``OnnxPolicy`` runs the model a SET_STATE carries (base64 of gzip of ONNX) with
onnxruntime; ``BoardPolicy`` (shared memory) runs the same network with numpy from
the weights board. Both take observations as leaf columns (leaf key -> [N, *record_shape]
in the record dtype; ``observation_features`` builds them from one native observation)
and give distribution inputs; ``ActionChooser`` samples from them while training (or
takes the mode with ``explore=False``) and reports the log-probability the learner needs.
No torch anywhere here.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol import codec, columns
from rlinkd.client_lib.protocol.distributions import ActionDist, components
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.netops import DIST, ROOT_FLOAT_INPUT, leaf_name
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Space

ONNX_INPUT = ROOT_FLOAT_INPUT
Obs = Mapping[str, np.ndarray] | np.ndarray


def decode_onnx(msg: codec.SetState) -> bytes:
    """ONNX bytes of a SET_STATE; checks ``onnx_sha256`` when the server sent it."""
    data = gzip.decompress(base64.b64decode(msg.onnx_file))
    if msg.onnx_sha256 and hashlib.sha256(data).hexdigest() != msg.onnx_sha256:
        raise ValueError("SET_STATE model does not match its onnx_sha256")
    return data


def observation_features(obs: Any, space: Space) -> dict[str, np.ndarray]:
    """One native observation -> leaf columns [1, *record_shape] (InvalidValue if it does not
    fit the space)."""
    return columns.to_columns([obs], space, 1, "obs")


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
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.weights_seq_no = msg.weights_seq_no

    def dist_inputs(self, obs: Obs) -> np.ndarray:
        """Dist inputs [N, D] for leaf columns (or a bare array for a one-input model)."""
        if not isinstance(obs, Mapping):
            return self.session.run([self.output], {self.input_names[0]: obs})[0]
        names = {leaf_name(key): key for key in obs}
        names.update({ROOT_FLOAT_INPUT: ""} if "" in obs else {})
        return self.session.run([self.output],
                                {n: obs[names[n]] for n in self.input_names})[0]


class BoardPolicy:
    """The actor's numpy forward pass on flat board weights (shared-memory clients).

    The network is compiled once per weights version (`NumpyNet`: layers transposed,
    closures bound), so one step of an MLP costs a few small matmuls. Same op list as the
    ONNX model and the learner's torch module.
    """

    def __init__(self, spec: PolicySpec, flat: np.ndarray, weights_seq_no: int) -> None:
        self.spec, self.flat, self.weights_seq_no = spec, flat, weights_seq_no
        self.net = NumpyNet(spec, flat, (DIST,))

    def dist_inputs(self, obs: Obs) -> np.ndarray:
        return self.net.run(self.spec.as_obs(obs))[DIST]


class ActionChooser:
    """Sampling/greedy action selection for one action space."""

    def __init__(self, act_space: Space, seed: int | None = None) -> None:
        self.space = act_space
        self.rng = np.random.default_rng(seed)
        self.dist = ActionDist(components(act_space))

    def choose(self, dist: np.ndarray, explore: bool) -> tuple[np.ndarray, float]:
        """(action index vector float32 [A], log-prob) from dist inputs [1, D]."""
        actions = self.dist.sample(dist, self.rng) if explore else self.dist.greedy(dist)
        return actions[0], float(self.dist.log_prob(dist, actions)[0])

    def to_env(self, action: np.ndarray) -> Any:
        """The action in the form a gymnasium env expects (Discrete: value = index + start)."""
        vec = np.asarray(action, np.float32).reshape(1, -1)
        return columns.native(columns.action_columns(vec, self.space), self.space, 0)
