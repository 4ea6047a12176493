"""The shape of the policy every rlinkd process agrees on, with numpy and ONNX forwards.

`PolicySpec` describes an MLP actor-critic. Its `param_layout()` fixes the order of the one
flat float32 weight vector that the learner publishes and that simulators, the connector and
the ONNX exporter read. Everything here is numpy + onnx only: a simulator that imports this
module never loads torch (the daemon's torch twin is `daemon.learner.model.ActorCritic`).

Parameter layout (flat vector, in this order):
    obs_mean [obs_size], obs_std [obs_size]          observation normaliser (identity: 0 / 1)
    pi.{i}.weight [out, in], pi.{i}.bias [out]       actor MLP, last layer width = action_size
    log_std [action_size]                            box actions only
    vf.{i}.weight [out, in], vf.{i}.bias [out]       critic MLP, last layer width = 1
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np
# onnx is imported inside the two functions that build graphs: processes that only run
# the numpy forward pass (connector, shared-memory clients) save ~10 MB of RSS.

ACTIVATIONS = ("tanh", "relu")
ACTION_KINDS = ("discrete", "box")
ONNX_INPUT_NAME = "onnx::Gemm_0"  # the input name RLlib's ONNX clients feed
ONNX_OUTPUT_NAME = "action_dist_inputs"
ONNX_OPSET = 17
ONNX_IR_VERSION = 8  # the IR that shipped with opset 17; accepted by onnxruntime >= 1.12
_LOG_2PI = math.log(2.0 * math.pi)


def _bounds_to_json(values: tuple[float, ...] | None) -> list | None:
    """Box bounds as JSON-safe values: infinities become the strings "inf" / "-inf"."""
    if values is None:
        return None
    return [v if math.isfinite(v) else ("inf" if v > 0 else "-inf") for v in values]


def _orthogonal(rng: np.random.Generator, shape: tuple[int, int], gain: float) -> np.ndarray:
    """An orthogonal [rows, cols] matrix scaled by gain (what torch.nn.init.orthogonal_ does)."""
    rows, cols = shape
    q, r = np.linalg.qr(rng.standard_normal((max(rows, cols), min(rows, cols))))
    q = q * np.sign(np.diag(r))  # make the decomposition unique (uniform over orthogonal)
    return gain * (q if rows >= cols else q.T)


@dataclass(frozen=True)
class PolicySpec:
    """An MLP actor-critic, described well enough to build, serialise and run it anywhere.

    `obs_size` is the flattened float observation size (for a Discrete(n) observation the
    daemon passes n and one-hot encodes); `obs_shape` is the shape a client feeds to ONNX.
    Construction raises ValueError on an inconsistent description.
    """

    obs_size: int
    obs_shape: tuple[int, ...]
    action_kind: str
    action_size: int
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    log_std_init: float = 0.0

    def __post_init__(self) -> None:
        for name in ("obs_shape", "hidden_sizes"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        for name in ("action_low", "action_high"):
            values = getattr(self, name)
            if values is not None:
                object.__setattr__(self, name, tuple(float(v) for v in values))
        self._validate()

    def _validate(self) -> None:
        if self.action_kind not in ACTION_KINDS:
            raise ValueError(f"action_kind must be one of {ACTION_KINDS}, not {self.action_kind!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, not {self.activation!r}")
        if self.obs_size < 1 or self.action_size < 1 or any(h < 1 for h in self.hidden_sizes):
            raise ValueError("obs_size, action_size and hidden sizes must be positive")
        if not self.obs_shape or math.prod(self.obs_shape) != self.obs_size:
            raise ValueError(f"obs_shape {self.obs_shape} does not hold obs_size={self.obs_size}")
        if self.action_kind == "box":
            low, high = self.action_low, self.action_high
            if low is None or high is None or len(low) != self.action_size or len(high) != self.action_size:
                raise ValueError("box actions need action_low/action_high of action_size")
            if any(lo > hi for lo, hi in zip(low, high)):
                raise ValueError("action_low must not exceed action_high")

    # ----------------------------------------------------------------- description
    @property
    def is_box(self) -> bool:
        return self.action_kind == "box"

    @property
    def dist_size(self) -> int:
        """Width of the distribution inputs: n logits, or 2*dim (mean then log_std) for box."""
        return 2 * self.action_size if self.is_box else self.action_size

    def to_json(self) -> dict:
        """A plain JSON-safe dict (infinite bounds as "inf"/"-inf"); inverse of from_json."""
        d = asdict(self)
        d["obs_shape"], d["hidden_sizes"] = list(self.obs_shape), list(self.hidden_sizes)
        d["action_low"] = _bounds_to_json(self.action_low)
        d["action_high"] = _bounds_to_json(self.action_high)
        return d

    @classmethod
    def from_json(cls, d: dict) -> PolicySpec:
        """Build from a to_json() dict; unknown keys raise TypeError, bad values ValueError."""
        return cls(**d)  # __post_init__ converts lists/strings ("inf") to tuples of floats

    # ----------------------------------------------------------------- flat weights
    def _layer_shapes(self, prefix: str, out_size: int) -> list[tuple[str, tuple[int, ...]]]:
        sizes = (self.obs_size, *self.hidden_sizes, out_size)
        layout: list[tuple[str, tuple[int, ...]]] = []
        for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
            layout += [(f"{prefix}.{i}.weight", (n_out, n_in)), (f"{prefix}.{i}.bias", (n_out,))]
        return layout

    def param_layout(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every tensor in the order of the shared flat float32 vector."""
        layout: list[tuple[str, tuple[int, ...]]] = [("obs_mean", (self.obs_size,)),
                                                     ("obs_std", (self.obs_size,))]
        layout += self._layer_shapes("pi", self.action_size)
        if self.is_box:
            layout.append(("log_std", (self.action_size,)))
        return layout + self._layer_shapes("vf", 1)

    def n_params(self) -> int:
        return sum(math.prod(shape) for _, shape in self.param_layout())

    def split_flat(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Name -> view into `flat` (no copy), reshaped per param_layout. ValueError on size."""
        flat = np.asarray(flat)
        if flat.shape != (self.n_params(),):
            raise ValueError(f"flat weights have shape {flat.shape}, expected ({self.n_params()},)")
        params, offset = {}, 0
        for name, shape in self.param_layout():
            size = math.prod(shape)
            params[name] = flat[offset:offset + size].reshape(shape)
            offset += size
        return params

    def init_flat(self, rng: np.random.Generator) -> np.ndarray:
        """Fresh float32 weights, CleanRL style: orthogonal weights (hidden gain sqrt 2, actor
        head 0.01, critic head 1.0), zero biases, identity normaliser, log_std = log_std_init."""
        flat = np.zeros(self.n_params(), dtype=np.float32)
        params = self.split_flat(flat)
        params["obs_std"][:] = 1.0
        if self.is_box:
            params["log_std"][:] = self.log_std_init
        last = len(self.hidden_sizes)
        for prefix, head_gain in (("pi", 0.01), ("vf", 1.0)):
            for i in range(last + 1):
                w = params[f"{prefix}.{i}.weight"]
                w[:] = _orthogonal(rng, w.shape, head_gain if i == last else math.sqrt(2.0))
        return flat

    # ----------------------------------------------------------------- numpy forward
    def _mlp(self, params: dict[str, np.ndarray], prefix: str, obs: np.ndarray) -> np.ndarray:
        x = (np.asarray(obs, np.float32).reshape(-1, self.obs_size) - params["obs_mean"])
        x = x / params["obs_std"]  # [N, obs_size]
        act = np.tanh if self.activation == "tanh" else (lambda v: np.maximum(v, 0.0))
        last = len(self.hidden_sizes)
        for i in range(last + 1):
            x = x @ params[f"{prefix}.{i}.weight"].T + params[f"{prefix}.{i}.bias"]
            if i < last:
                x = act(x)
        return x

    def actor_forward(self, flat: np.ndarray, obs: np.ndarray) -> np.ndarray:
        """Distribution inputs [N, dist_size] float32 for obs [N, obs_size] (or [N, *obs_shape])."""
        params = self.split_flat(flat)
        out = self._mlp(params, "pi", obs)  # [N, action_size]: logits, or box mean
        if self.is_box:
            out = np.concatenate([out, np.broadcast_to(params["log_std"], out.shape)], axis=1)
        return out.astype(np.float32, copy=False)

    def value_forward(self, flat: np.ndarray, obs: np.ndarray) -> np.ndarray:
        """State values [N] float32."""
        return self._mlp(self.split_flat(flat), "vf", obs)[:, 0].astype(np.float32, copy=False)

    # ----------------------------------------------------------------- distributions
    def _split_gaussian(self, dist_inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d = np.asarray(dist_inputs, np.float64)
        return d[:, :self.action_size], d[:, self.action_size:]  # mean [N, A], log_std [N, A]

    def _clip(self, actions: np.ndarray) -> np.ndarray:
        return np.clip(actions, self.action_low, self.action_high).astype(np.float32)

    def sample_actions(self, dist_inputs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Discrete: int64 [N] drawn from softmax(logits). Box: float32 [N, A] Gaussian sample
        clipped to [low, high] (log_prob must then be evaluated at this clipped action)."""
        if self.is_box:
            mean, log_std = self._split_gaussian(dist_inputs)
            return self._clip(mean + np.exp(log_std) * rng.standard_normal(mean.shape))
        cdf = np.cumsum(np.exp(_log_softmax(dist_inputs)), axis=1)  # [N, n]
        u = rng.random((cdf.shape[0], 1)) * cdf[:, -1:]  # scale: cdf[-1] may be 1 - 1e-16
        return np.minimum((cdf <= u).sum(axis=1), self.action_size - 1).astype(np.int64)

    def greedy_actions(self, dist_inputs: np.ndarray) -> np.ndarray:
        """Most likely action: argmax logits (int64 [N]) or the clipped mean (float32 [N, A])."""
        if self.is_box:
            return self._clip(self._split_gaussian(dist_inputs)[0])
        return np.argmax(dist_inputs, axis=1).astype(np.int64)

    def log_prob(self, dist_inputs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """log pi(a|s) [N] float32; box: diagonal Gaussian density at the given actions."""
        if self.is_box:
            mean, log_std = self._split_gaussian(dist_inputs)
            z = (np.asarray(actions, np.float64).reshape(mean.shape) - mean) / np.exp(log_std)
            return (-0.5 * z**2 - log_std - 0.5 * _LOG_2PI).sum(axis=1).astype(np.float32)
        logp = _log_softmax(dist_inputs)  # [N, n]
        idx = np.rint(np.asarray(actions).reshape(-1)).astype(np.int64)
        return logp[np.arange(len(logp)), idx].astype(np.float32)

    def entropy(self, dist_inputs: np.ndarray) -> np.ndarray:
        """Entropy of each row's distribution [N] float32."""
        if self.is_box:
            log_std = self._split_gaussian(dist_inputs)[1]
            return (log_std + 0.5 * (1.0 + _LOG_2PI)).sum(axis=1).astype(np.float32)
        logp = _log_softmax(dist_inputs)
        return -(np.exp(logp) * logp).sum(axis=1).astype(np.float32)


# Module-level spellings of the numpy helpers, `f(spec, ...) == spec.f(...)`, for callers that
# hold the spec as data (the connector pipeline uses these).
def actor_forward(spec: PolicySpec, flat: np.ndarray, obs: np.ndarray) -> np.ndarray:
    return spec.actor_forward(flat, obs)


def value_forward(spec: PolicySpec, flat: np.ndarray, obs: np.ndarray) -> np.ndarray:
    return spec.value_forward(flat, obs)


def sample_actions(spec: PolicySpec, dist_inputs: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    return spec.sample_actions(dist_inputs, rng)


def greedy_actions(spec: PolicySpec, dist_inputs: np.ndarray) -> np.ndarray:
    return spec.greedy_actions(dist_inputs)


def log_prob(spec: PolicySpec, dist_inputs: np.ndarray, actions: np.ndarray) -> np.ndarray:
    return spec.log_prob(dist_inputs, actions)


def entropy(spec: PolicySpec, dist_inputs: np.ndarray) -> np.ndarray:
    return spec.entropy(dist_inputs)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """Stable log-softmax over the last axis, in float64."""
    x = np.asarray(logits, np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


# --------------------------------------------------------------------- ONNX
def _actor_param_names(spec: PolicySpec) -> list[str]:
    """The layout names the ONNX actor graph uses (the critic is not exported)."""
    return [name for name, _ in spec.param_layout() if not name.startswith("vf.")]


def _actor_nodes(spec: PolicySpec) -> list:
    from onnx import helper
    nodes, x = [], ONNX_INPUT_NAME
    if len(spec.obs_shape) > 1:
        nodes.append(helper.make_node("Flatten", [x], ["obs_flat"], axis=1))
        x = "obs_flat"
    nodes += [helper.make_node("Sub", [x, "obs_mean"], ["obs_centered"]),
              helper.make_node("Div", ["obs_centered", "obs_std"], ["obs_normalized"])]
    x, last = "obs_normalized", len(spec.hidden_sizes)
    activation = "Tanh" if spec.activation == "tanh" else "Relu"
    for i in range(last + 1):
        head = i == last
        out = ("action_mean" if spec.is_box else ONNX_OUTPUT_NAME) if head else f"pi.{i}.pre"
        nodes.append(helper.make_node("Gemm", [x, f"pi.{i}.weight", f"pi.{i}.bias"], [out],
                                      transB=1))
        x = out
        if not head:
            nodes.append(helper.make_node(activation, [out], [f"pi.{i}.out"]))
            x = f"pi.{i}.out"
    if spec.is_box:  # concat(mean, log_std expanded to the batch)
        nodes += [helper.make_node("Shape", ["action_mean"], ["action_mean_shape"]),
                  helper.make_node("Expand", ["log_std", "action_mean_shape"], ["log_std_batch"]),
                  helper.make_node("Concat", ["action_mean", "log_std_batch"],
                                   [ONNX_OUTPUT_NAME], axis=1)]
    return nodes


def build_onnx_model(spec: PolicySpec, flat: np.ndarray | None = None):
    """The actor as an ONNX model, built with onnx.helper (no torch): input `onnx::Gemm_0`
    [batch, *obs_shape] float32, output `action_dist_inputs` [batch, dist_size]. Initializers
    carry the layout names and raw float32 data from `flat` (identity/zero weights if None).
    Build once per spec; refresh weights with OnnxWeightWriter.encode."""
    from onnx import TensorProto, helper, numpy_helper
    params = spec.split_flat(np.zeros(spec.n_params(), np.float32) if flat is None else flat)
    initializers = [numpy_helper.from_array(np.asarray(params[n], np.float32), name=n)
                    for n in _actor_param_names(spec)]
    graph = helper.make_graph(
        _actor_nodes(spec), "rlinkd_actor",
        [helper.make_tensor_value_info(ONNX_INPUT_NAME, TensorProto.FLOAT,
                                       ["batch", *spec.obs_shape])],
        [helper.make_tensor_value_info(ONNX_OUTPUT_NAME, TensorProto.FLOAT,
                                       ["batch", spec.dist_size])],
        initializer=initializers)
    model = helper.make_model(graph, producer_name="rlinkd",
                              opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = ONNX_IR_VERSION
    return model


class OnnxWeightWriter:
    """ONNX bytes for new weights without rebuilding the graph or touching protobuf.

    The model is built and serialised once, with every actor initializer's raw data set
    to a unique random pattern; the offsets of those patterns in the serialised bytes are
    remembered, and ``encode`` copies the new float32 weights over them. Each encode is
    a few memcpys. (Mutating one protobuf ModelProto per version instead leaked: upb
    frees replaced bytes fields only with the whole message, ~30 KB per version.)
    Called once per published weight version; not thread-safe.
    """

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec
        self.model = build_onnx_model(spec)
        slices, offset = {}, 0
        for name, shape in spec.param_layout():
            slices[name] = (offset, offset + math.prod(shape))
            offset += math.prod(shape)
        self.template, self._targets = self._patchable_template(slices)

    def _patchable_template(self, slices: dict) -> tuple[bytes, list[tuple[int, int, int]]]:
        rng = np.random.default_rng(0x0ddba11)
        inits = {t.name: t for t in self.model.graph.initializer}
        markers = {}
        for name in _actor_param_names(self.spec):
            start, stop = slices[name]
            markers[name] = rng.bytes(4 * (stop - start))
            inits[name].raw_data = markers[name]
        template = self.model.SerializeToString()
        targets = []
        for name, marker in markers.items():
            at = template.find(marker)
            if at < 0 or template.find(marker, at + 1) >= 0:
                raise ValueError(f"cannot locate initializer {name} in the serialised model")
            targets.append((*slices[name], at))
        return template, targets

    def encode(self, flat: np.ndarray) -> bytes:
        """ONNX model bytes carrying `flat` (layout order). ValueError on a wrong-size vector."""
        flat = np.ascontiguousarray(flat, dtype="<f4")  # ONNX raw_data is little-endian
        if flat.shape != (self.spec.n_params(),):
            raise ValueError(f"flat weights have shape {flat.shape}, "
                             f"expected ({self.spec.n_params()},)")
        out = bytearray(self.template)
        raw = flat.tobytes()
        for start, stop, at in self._targets:
            out[at:at + 4 * (stop - start)] = raw[4 * start:4 * stop]
        return bytes(out)
