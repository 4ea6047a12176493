"""Client-side inference: turn an observation into an action without asking the server.

``OnnxPolicy`` runs the model a SET_STATE carries (base64 of gzip of ONNX) with
onnxruntime; ``BoardPolicy`` (shared memory) runs the same network with numpy from
the weights board. Both give distribution inputs (``forward``: and, for a recurrent policy,
the state after the step, see ``protocol.recurrent``); ``ActionChooser`` samples from
them while training (or takes the mode with ``explore=False``) and reports the
log-probability the learner needs. No torch anywhere here.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
from collections.abc import Mapping

import numpy as np

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.columns import Columns, action_columns, native, native_batch
from rlinkd.client_lib.protocol.distributions import ActionDist, categorical_one, components
from rlinkd.client_lib.protocol.masking import MASKED_LOGIT
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.netonnx import OnnxWeightWriter
from rlinkd.client_lib.protocol import netops
from rlinkd.client_lib.protocol.netops import DIST, STATE_IN, STATE_OUT
from rlinkd.client_lib.protocol.policy_spec import ONNX_OUTPUT_NAME, PolicySpec
from rlinkd.client_lib.protocol.spaces import Discrete, Space

ONNX_INPUT = "onnx::Gemm_0"


def decode_onnx(msg: codec.SetState) -> bytes:
    """ONNX bytes of a SET_STATE; checks ``onnx_sha256`` when the server sent it."""
    data = gzip.decompress(base64.b64decode(msg.onnx_file))
    if msg.onnx_sha256 and hashlib.sha256(data).hexdigest() != msg.onnx_sha256:
        raise ValueError("SET_STATE model does not match its onnx_sha256")
    return data


def onnx_input_key(name: str) -> str:
    """The observation leaf an ONNX input feeds: "onnx::Gemm_0" (a flat Box, as RLlib
    exports it) and "obs" are the root leaf, "obs.<key>" is leaf <key> (see
    docs/networks.md)."""
    if name in (ONNX_INPUT, "obs"):
        return ""
    if name.startswith("obs."):
        return name[4:]
    raise ValueError(f"ONNX input {name!r} is not an observation leaf")


def has_conv(spec: PolicySpec) -> bool:
    """Whether the network has convolutions (then it runs in onnxruntime, not numpy)."""
    return any(isinstance(op, netops.Conv) for op in spec.ops())


def session(model: bytes, threads: int = 1):
    """A CPU onnxruntime session on ``threads`` threads (one: a simulator runs many)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


class OnnxPolicy:
    """An onnxruntime session on one weights version. Inputs are matched to observation
    leaves by name (``onnx_input_key``); a model with one input of another name (trained
    elsewhere, served for a frozen policy) gets the only observation leaf. A recurrent model
    (an input "state_in" [batch, S]) has ``state_size`` S, else 0."""

    def __init__(self, msg: codec.SetState, policy: str = "default") -> None:
        self.session = session(decode_onnx(msg))
        self.epsilon = codec.epsilon_of(msg.exploration, policy)  # DQN: epsilon-greedy
        self.output = self.session.get_outputs()[0].name
        graph_inputs = {i.name: i for i in self.session.get_inputs()}
        state = graph_inputs.pop(STATE_IN, None)
        self.state_size = int(state.shape[1]) if state is not None else 0
        self.inputs = {name: _input_key(name, len(graph_inputs)) for name in graph_inputs}
        self.weights_seq_no = msg.weights_seq_no

    def forward(self, obs: Columns | np.ndarray, state: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray | None]:
        """(dist inputs [N, D], state after the step [N, S]) from observation columns and
        the state before it (a recurrent model; None and None for a feed-forward one)."""
        if not self.state_size:
            return self.dist_inputs(obs), None
        feed = self._feed(obs)
        feed[STATE_IN] = np.asarray(state, np.float32)
        dist, state_out = self.session.run([self.output, STATE_OUT], feed)
        return dist, state_out

    def dist_inputs(self, obs: Columns | np.ndarray) -> np.ndarray:
        """[N, dist_size] for observation columns (leaf key -> [N, ...], record dtypes; a
        bare array for a root leaf)."""
        return self.session.run([self.output], self._feed(obs))[0]

    def _feed(self, obs: Columns | np.ndarray) -> dict[str, np.ndarray]:
        obs = obs if isinstance(obs, Mapping) else {"": obs}
        return {name: obs[key] if key is not None else next(iter(obs.values()))
                for name, key in self.inputs.items()}


def forward(net, obs: Columns | np.ndarray, state: np.ndarray | None
            ) -> tuple[np.ndarray, np.ndarray | None]:
    """One step of any local policy: (dist inputs, state after the step); a feed-forward
    policy (``state`` None) only needs ``dist_inputs``."""
    return (net.dist_inputs(obs), None) if state is None else net.forward(obs, state)


def state_size(net) -> int:
    """S of a local policy's state (0: feed-forward, or a policy that does not say)."""
    return int(getattr(net, "state_size", 0))


def _input_key(name: str, n_inputs: int) -> str | None:
    """The leaf an input feeds; None: "the only one" (a single input of a foreign name)."""
    try:
        return onnx_input_key(name)
    except ValueError:
        if n_inputs == 1:
            return None
        raise


class BoardPolicy:
    """The actor on flat board weights (shared-memory clients): the spec's numpy forward,
    compiled once per weights version (~15 us a step for a 64x64 MLP). Networks with
    convolutions run in onnxruntime instead (a numpy im2col convolution costs
    milliseconds per step: see docs/networks.md)."""

    def __init__(self, spec: PolicySpec, flat: np.ndarray, weights_seq_no: int,
                 epsilon: float | None = None) -> None:
        self.spec, self.flat, self.weights_seq_no = spec, flat, weights_seq_no
        self.epsilon = epsilon  # DQN: epsilon-greedy (from WEIGHTS_READY)
        self.conv = has_conv(spec)
        self.state_size = spec.state_size
        if self.conv:
            self._onnx = session(OnnxWeightWriter(spec).encode(flat))
            self._names = {i.name: onnx_input_key(i.name) for i in self._onnx.get_inputs()
                           if i.name != STATE_IN}
        else:
            self._net = NumpyNet(spec, flat, (DIST, STATE_OUT) if self.state_size else (DIST,))

    def forward(self, obs: Columns | np.ndarray, state: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray | None]:
        """As ``OnnxPolicy.forward``: (dist inputs, state after the step or None)."""
        if not self.state_size:
            return self.dist_inputs(obs), None
        obs = obs if isinstance(obs, Mapping) else {"": obs}
        if self.conv:
            feed = {name: obs[key] for name, key in self._names.items()}
            feed[STATE_IN] = np.asarray(state, np.float32)
            dist, state_out = self._onnx.run([ONNX_OUTPUT_NAME, STATE_OUT], feed)
            return dist, state_out
        out = self._net.run(obs, state)
        return out[DIST], out[STATE_OUT]

    def dist_inputs(self, obs: Columns | np.ndarray) -> np.ndarray:
        """[N, dist_size] for observation columns (or a bare array for a root leaf)."""
        obs = obs if isinstance(obs, Mapping) else {"": obs}
        if self.conv:
            feed = {name: obs[key] for name, key in self._names.items()}
            return self._onnx.run([ONNX_OUTPUT_NAME], feed)[0]
        return self._net.run(obs)[DIST]


class ActionChooser:
    """Sampling/greedy action selection over the product distribution of an action space.
    Actions are float32 index vectors [action_size] (``columns.action_columns`` turns them
    into native values)."""

    def __init__(self, act_space: Space, seed: int | None = None,
                 rng: np.random.Generator | None = None, box_dist: str = "gaussian") -> None:
        self.space = act_space
        self.rng = rng if rng is not None else np.random.default_rng(seed)
        self.dist = ActionDist(components(act_space, box_dist))

    def choose(self, dist: np.ndarray, explore: bool, epsilon: float | None = None
               ) -> tuple[np.ndarray, float]:
        """(action vector [A] float32, its log-prob) from dist inputs [1, D]. ``epsilon``
        (a DQN policy's exploration, from SET_STATE/WEIGHTS_READY): exploring means
        epsilon-greedy over the Q-values in ``dist`` instead of sampling."""
        if explore and epsilon is not None:
            actions, logp = self._epsilon_greedy(dist, epsilon)
            return actions[0], float(logp[0])
        if explore and self._single_categorical:
            return self._sample_categorical(dist[0])
        actions = self.dist.sample(dist, self.rng) if explore else self.dist.greedy(dist)
        return actions[0], float(self.dist.log_prob(dist, actions)[0])

    def choose_batch(self, dist: np.ndarray, explore: bool, epsilon: float | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
        """(action vectors [N, A] float32, log-probs [N] float32) from dist inputs [N, D]:
        one vectorised draw for all rows (one row: the single-row fast path)."""
        if len(dist) == 1:
            action, logp = self.choose(dist, explore, epsilon)
            return action[None], np.array([logp], np.float32)
        if explore and epsilon is not None:
            return self._epsilon_greedy(dist, epsilon)
        actions = self.dist.sample(dist, self.rng) if explore else self.dist.greedy(dist)
        return actions, self.dist.log_prob(dist, actions)

    def _epsilon_greedy(self, q: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
        """One Discrete action per row: with probability ``epsilon`` uniform over the legal
        actions (Q above MASKED_LOGIT / 2), else the argmax; log-probs of that mixture."""
        if not self._single_categorical:
            raise ValueError("epsilon-greedy exploration needs a single Discrete action")
        legal = q > MASKED_LOGIT / 2                                      # [N, K]
        greedy = q.argmax(axis=1)                                         # [N]
        counts = legal.sum(axis=1)                                        # [N]
        picks = np.floor(self.rng.random(len(q)) * counts).astype(np.int64)
        uniform = np.argmax(np.cumsum(legal, axis=1) > picks[:, None], axis=1)
        actions = np.where(self.rng.random(len(q)) < epsilon, uniform, greedy)
        prob = epsilon / counts + (1.0 - epsilon) * (actions == greedy)
        return actions.astype(np.float32)[:, None], np.log(prob).astype(np.float32)

    @property
    def _single_categorical(self) -> bool:
        comps = self.dist.comps
        return len(comps) == 1 and comps[0].kind == "categorical"

    def _sample_categorical(self, logits: np.ndarray) -> tuple[np.ndarray, float]:
        """The one-Discrete case (CartPole's) on one row in plain Python floats
        (``categorical_one``): same distribution and log-prob as the product distribution."""
        a, logp = categorical_one(logits.tolist(), self.rng.random())
        return np.array([a], np.float32), logp

    def to_env(self, action: np.ndarray):
        """The action in the form a gymnasium env expects (a lone Discrete: its int at once)."""
        if type(self.space) is Discrete:
            return round(float(action[0])) + self.space.start
        return native(action_columns(action[None], self.space), self.space, 0)

    def to_env_rows(self, actions: np.ndarray) -> list:
        """Each row of action vectors [N, A] in the form a gymnasium env expects."""
        columns = action_columns(actions, self.space)
        return [native(columns, self.space, i) for i in range(len(actions))]

    def to_env_batch(self, actions: np.ndarray):
        """Action vectors [N, A] as a gymnasium VectorEnv takes them (batched leaves in the
        space's structure, see ``columns.native_batch``)."""
        return native_batch(action_columns(actions, self.space), self.space)
