"""The network of a `PolicySpec`, lowered to one small op list: THE description of the maths.

`lower(spec)` turns the observation and action spaces into a straight-line program over
named values plus the declaration of every parameter it reads (in the order of the flat
weight vector). Three interpreters run that one program, each op implemented once per
backend: numpy (`netnumpy`, shared-memory clients and the connector), ONNX (`netonnx`, the
model clients download) and torch (`rlinkd.daemon.learner.model`, what the learner trains).
Nothing here imports onnx or torch.

Lowering (per observation leaf, in leaf order; the action-mask leaf is an input, not a feature):
    root float Box          Input "onnx::Gemm_0" -> Flatten (rank > 1) -> Normalize(obs_mean, obs_std)
    other Box, rank != 3    Input -> Cast (non-float) -> Flatten -> Normalize (bool: no Normalize)
    uint8 Box, rank 3       Input [N,H,W,C] -> Cast -> Scale(1/255) -> CNN
    other Box, rank 3       Input -> Cast -> Normalize (float/int, per pixel) -> CNN
    Discrete(n, start)      Input [N] int64 -> Flatten -> OneHot (n columns)
    MultiDiscrete           Input [N,k] int64 -> OneHot (sum(nvec) columns)
    MultiBinary(n)          Input [N,n] int8 -> Cast
    CNN                     ToNCHW -> (Conv -> relu)* -> Flatten -> Linear(dense) -> relu
    optional vector MLP     (encoder_hidden_sizes) Linear -> act, on every non-image leaf
Then features = Concat(leaf features); with `recurrent` ("lstm" | "gru", see `recurrent`) a
State input and one Recurrent cell follow (features -> the cell's new hidden state, shared by
actor and critic); actor `pi` and critic `vf` MLP trunks (hidden_sizes,
`activation`) over the features; the actor head is one Linear whose columns are cut into the
`action_dist_inputs` layout (see `PolicySpec`), Box leaves adding a log-std parameter tiled
over the batch (squashed Gaussian: the head gives means and log-stds, the latter Clipped to
LOG_STD_RANGE) and categorical logits passing through `Mask` when an action mask is declared.

Value names derived from a leaf carry a "/" suffix ("obs.camera/conv.0.out"): a "/" never
occurs in a space key, so derived names cannot collide with an input name.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol.masking import MASKED_LOGIT as MASKED_LOGIT  # re-exported
from rlinkd.client_lib.protocol.recurrent import CELLS as CELLS  # re-exported
from rlinkd.client_lib.protocol.recurrent import GATES, state_width
from rlinkd.client_lib.protocol.recurrent import STATE_IN as STATE_IN  # re-exported
from rlinkd.client_lib.protocol.recurrent import STATE_OUT as STATE_OUT  # re-exported
from rlinkd.client_lib.protocol.spaces import Box, Discrete, MultiBinary, MultiDiscrete

DIST = "action_dist_inputs"   # the actor output (ONNX output name)
VALUE = "value"               # the critic output [N, 1]
ROOT_FLOAT_INPUT = "onnx::Gemm_0"  # the input name RLlib's JSON-era clients feed
ACTIVATIONS = ("tanh", "relu")
LOG_STD_RANGE = (-20.0, 2.0)  # a squashed Gaussian's log-std is clipped here (SAC)
NATURE_CNN = ((32, 64, 64), (8, 4, 3), (4, 2, 1), 512)  # channels, kernels, strides, dense
NATURE_MIN_SIDE = 36          # min(H, W) from which the Nature CNN is the default


# ------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class Param:
    """One tensor of the flat weight vector.

    init: "zeros" | "fill" (every element = value) | "orthogonal" (gain = value, on the
    matrix [shape[0], prod(shape[1:])]). Non-trainable params are the observation
    normaliser's statistics, which the learner copies in.
    """
    name: str
    shape: tuple[int, ...]
    init: str
    value: float = 0.0
    trainable: bool = True


# ------------------------------------------------------------------------- ops
# Every op names its output `out`; value inputs are the fields listed in VALUE_FIELDS,
# parameter inputs those in PARAM_FIELDS. All intermediate values are float32 except Inputs.
VALUE_FIELDS = ("x", "xs", "mask", "state")
PARAM_FIELDS = ("weight", "bias", "mean", "std", "param", "weight_ih", "weight_hh", "bias_ih",
                "bias_hh")


class Op:
    """Base of the ops: the value and parameter names it reads."""

    out: str  # every op's output value (a dataclass field of each subclass)

    def inputs(self) -> tuple[str, ...]:
        names: list[str] = []
        for f in fields(self):  # type: ignore[arg-type]
            if f.name in VALUE_FIELDS:
                value = getattr(self, f.name)
                names += list(value) if isinstance(value, tuple) else [value]
        return tuple(names)

    def params(self) -> tuple[str, ...]:
        return tuple(getattr(self, f.name) for f in fields(self)  # type: ignore[arg-type]
                     if f.name in PARAM_FIELDS)


@dataclass(frozen=True)
class Input(Op):
    """An observation leaf, [N, *shape] of `dtype` (numpy dtype str); `key` = the leaf key."""
    out: str
    key: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Cast(Op):
    """To float32 (bool: 0/1)."""
    out: str
    x: str


@dataclass(frozen=True)
class Scale(Op):
    """x * factor."""
    out: str
    x: str
    factor: float


@dataclass(frozen=True)
class Normalize(Op):
    """(x - mean) / std, broadcast over the batch."""
    out: str
    x: str
    mean: str
    std: str


@dataclass(frozen=True)
class OneHot(Op):
    """x int [N, k] -> float32 [N, len(columns)]: out[:, j] = (x[:, columns[j]] == values[j])."""
    out: str
    x: str
    columns: tuple[int, ...]
    values: tuple[int, ...]


@dataclass(frozen=True)
class Flatten(Op):
    """[N, ...] -> [N, prod(...)] (a rank-1 [N] becomes [N, 1])."""
    out: str
    x: str


@dataclass(frozen=True)
class ToNCHW(Op):
    """[N, H, W, C] -> [N, C, H, W]."""
    out: str
    x: str


@dataclass(frozen=True)
class Conv(Op):
    """2-D convolution, valid padding: weight [out_c, in_c, k, k], bias [out_c]."""
    out: str
    x: str
    weight: str
    bias: str
    stride: int


@dataclass(frozen=True)
class Linear(Op):
    """x @ weight.T + bias; weight [out, in]."""
    out: str
    x: str
    weight: str
    bias: str


@dataclass(frozen=True)
class Act(Op):
    """Elementwise activation: "tanh" or "relu"."""
    out: str
    x: str
    kind: str


@dataclass(frozen=True)
class Concat(Op):
    """Concatenate [N, *] values along axis 1."""
    out: str
    xs: tuple[str, ...]


@dataclass(frozen=True)
class Slice(Op):
    """Columns [start, stop) of x [N, W]."""
    out: str
    x: str
    start: int
    stop: int


@dataclass(frozen=True)
class Tile(Op):
    """A parameter [W] repeated for every row of x: [N, W]."""
    out: str
    x: str
    param: str


@dataclass(frozen=True)
class Clip(Op):
    """min(max(x, low), high), elementwise."""
    out: str
    x: str
    low: float
    high: float


@dataclass(frozen=True)
class Mask(Op):
    """where(mask[:, start:stop] != 0, x, MASKED_LOGIT): x [N, stop - start] logits."""
    out: str
    x: str
    mask: str
    start: int
    stop: int


@dataclass(frozen=True)
class State(Op):
    """The recurrent state carried from the previous step: float32 [N, width], a graph input
    beside the observation leaves (all zeros at an episode start; see `recurrent`)."""
    out: str
    width: int


@dataclass(frozen=True)
class Recurrent(Op):
    """One step of a recurrent cell ("lstm" | "gru", PyTorch's gate order and maths):
    features x [N, F] and state [N, S] -> the new state [N, S] (layout: `recurrent`).
    size is H; weight_ih [G*H, F], weight_hh [G*H, H], bias_ih/bias_hh [G*H]; G = 4 (LSTM)
    or 3 (GRU)."""
    out: str
    x: str
    state: str
    cell: str
    size: int
    weight_ih: str
    weight_hh: str
    bias_ih: str
    bias_hh: str


@dataclass(frozen=True)
class Net:
    """The lowered network: ops in execution order, params in flat-vector order."""
    ops: tuple[Op, ...]
    params: tuple[Param, ...]

    def needed(self, outputs: Iterable[str]) -> tuple[Op, ...]:
        """The ops `outputs` depend on, in execution order (e.g. the actor without the critic)."""
        wanted, keep = set(outputs), []
        for op in reversed(self.ops):
            if op.out in wanted:
                keep.append(op)
                wanted.update(op.inputs())
        return tuple(reversed(keep))

    def inputs(self, outputs: Iterable[str] = (DIST, VALUE)) -> tuple[Input, ...]:
        return tuple(op for op in self.needed(outputs) if isinstance(op, Input))

    def states(self, outputs: Iterable[str] = (DIST, VALUE)) -> tuple[State, ...]:
        """The State inputs `outputs` read: () for a feed-forward network."""
        return tuple(op for op in self.needed(outputs) if isinstance(op, State))

    @property
    def state_width(self) -> int:
        """Width of STATE_IN / STATE_OUT; 0 for a feed-forward network."""
        return sum(op.width for op in self.ops if isinstance(op, State))

    def param_names(self, outputs: Iterable[str]) -> tuple[str, ...]:
        """Params read by the ops `outputs` depend on, in flat-vector order."""
        used = {p for op in self.needed(outputs) for p in op.params()}
        return tuple(p.name for p in self.params if p.name in used)


# ------------------------------------------------------------------------- leaf families
def family(space: Any) -> str:
    """"box", "discrete", "multi_discrete" or "multi_binary" for a leaf space."""
    for cls, name in ((Box, "box"), (Discrete, "discrete"), (MultiDiscrete, "multi_discrete"),
                      (MultiBinary, "multi_binary")):
        if isinstance(space, cls):
            return name
    raise ValueError(f"{type(space).__name__} is not a leaf space")


def leaf_name(key: str) -> str:
    """The base of a leaf's parameter/value names: "obs" for a root leaf, else "obs." + key."""
    return "obs" if key == "" else f"obs.{key}"


def input_name(key: str, record_dtype: np.dtype) -> str:
    """ONNX input name of an observation leaf: "onnx::Gemm_0" for a root float32 leaf (RLlib
    clients feed that name), "obs" for another root leaf, else "obs." + leaf key."""
    if key == "" and np.dtype(record_dtype) == np.float32:
        return ROOT_FLOAT_INPUT
    return leaf_name(key)


def cnn_layers(spec: Any, key: str, hwc: tuple[int, ...]
               ) -> tuple[tuple[tuple[int, int, int], ...], int]:
    """((channels, kernel, stride) per conv layer, dense width) for an image leaf [H, W, C]:
    the spec's cnn_* settings, else Nature-CNN when min(H, W) >= 36, else a small default.
    ValueError when the stack does not fit the image."""
    side = min(hwc[0], hwc[1])
    if spec.cnn_channels:
        strides = spec.cnn_strides or (1,) * len(spec.cnn_channels)
        layers = tuple(zip(spec.cnn_channels, spec.cnn_kernels, strides))
        dense = spec.cnn_dense or (NATURE_CNN[3] if side >= NATURE_MIN_SIDE else 128)
    elif side >= NATURE_MIN_SIDE:
        layers, dense = tuple(zip(*NATURE_CNN[:3])), spec.cnn_dense or NATURE_CNN[3]
    else:
        k = min(3, side)
        layers = ((16, k, 1), (32, 3, 1)) if side >= 5 else ((16, k, 1),)
        dense = spec.cnn_dense or 128
    h, w = hwc[0], hwc[1]
    for channels, kernel, stride in layers:
        if kernel > h or kernel > w:
            raise ValueError(f"observation {key or '(root)'} of shape {hwc}: conv layer "
                             f"{channels}x{kernel}x{kernel}/{stride} does not fit a {h}x{w} "
                             f"input; choose smaller cnn_kernels/cnn_strides")
        h, w = (h - kernel) // stride + 1, (w - kernel) // stride + 1
    return layers, dense


# ------------------------------------------------------------------------- lowering
class _Builder:
    """Collects ops and params, tracking the width of every 2-D value."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.params: list[Param] = []
        self.width: dict[str, int] = {}

    def op(self, op: Op, width: int = 0) -> str:
        out = op.out
        self.ops.append(op)
        self.width[out] = width
        return out

    def param(self, name: str, shape: tuple[int, ...], init: str, value: float = 0.0,
              trainable: bool = True) -> str:
        self.params.append(Param(name, tuple(shape), init, value, trainable))
        return name

    def linear(self, x: str, prefix: str, n_out: int, gain: float, out: str = "") -> str:
        w = self.param(f"{prefix}.weight", (n_out, self.width[x]), "orthogonal", gain)
        b = self.param(f"{prefix}.bias", (n_out,), "zeros")
        return self.op(Linear(out or f"{prefix}.pre", x, w, b), n_out)

    def mlp(self, x: str, prefix: str, hidden: Sequence[int], act: str,
            head: tuple[int, float, str] | None) -> str:
        """Hidden layers (gain sqrt 2, then `act`), then optionally a head (width, gain, out)."""
        sizes = [(h, math.sqrt(2.0)) for h in hidden]
        for i, (n_out, gain) in enumerate(sizes):
            x = self.op(Act(f"{prefix}.{i}.out", self.linear(x, f"{prefix}.{i}", n_out, gain),
                            act), n_out)
        if head is not None:
            x = self.linear(x, f"{prefix}.{len(sizes)}", head[0], head[1], out=head[2])
        return x

    def flatten(self, x: str, name: str, shape: tuple[int, ...]) -> str:
        if len(shape) == 1:
            return x
        return self.op(Flatten(f"{name}/flat", x), math.prod(shape))


def _encode_vector_box(b: _Builder, name: str, x: str, space: Any, shape: tuple[int, ...],
                       dtype: np.dtype) -> str:
    if dtype != np.float32:
        x = b.op(Cast(f"{name}/f32", x))
    x = b.flatten(x, name, shape)
    size = math.prod(shape)
    b.width[x] = size
    if np.dtype(space.dtype) == np.bool_:
        return x
    mean = b.param(f"{name}_mean", (size,), "zeros", trainable=False)
    std = b.param(f"{name}_std", (size,), "fill", 1.0, trainable=False)
    return b.op(Normalize(f"{name}/norm", x, mean, std), size)


def _encode_image(b: _Builder, spec: Any, key: str, x: str, space: Any,
                  shape: tuple[int, ...], dtype: np.dtype) -> str:
    name = leaf_name(key)
    layers, dense = cnn_layers(spec, key, shape)
    if dtype != np.float32:
        x = b.op(Cast(f"{name}/f32", x))
    if np.dtype(space.dtype) == np.uint8:
        x = b.op(Scale(f"{name}/scaled", x, 1.0 / 255.0))
    elif np.dtype(space.dtype) != np.bool_:
        mean = b.param(f"{name}_mean", shape, "zeros", trainable=False)
        std = b.param(f"{name}_std", shape, "fill", 1.0, trainable=False)
        x = b.op(Normalize(f"{name}/norm", x, mean, std))
    x = b.op(ToNCHW(f"{name}/nchw", x))
    h, w, channels_in = shape
    for i, (channels, kernel, stride) in enumerate(layers):
        wname = b.param(f"{name}/conv.{i}.weight", (channels, channels_in, kernel, kernel),
                        "orthogonal", math.sqrt(2.0))
        bname = b.param(f"{name}/conv.{i}.bias", (channels,), "zeros")
        x = b.op(Conv(f"{name}/conv.{i}.pre", x, wname, bname, stride))
        x = b.op(Act(f"{name}/conv.{i}.out", x, "relu"))
        h, w, channels_in = (h - kernel) // stride + 1, (w - kernel) // stride + 1, channels
    x = b.op(Flatten(f"{name}/conv.flat", x), h * w * channels_in)
    x = b.linear(x, f"{name}/dense", dense, math.sqrt(2.0))
    return b.op(Act(f"{name}/dense.out", x, "relu"), dense)


def _encode_leaf(b: _Builder, spec: Any, leaf: Any) -> str:
    """Emit the encoder of one observation leaf; returns its [N, F] feature value."""
    space, fam = leaf.space, family(leaf.space)
    dtype, shape = np.dtype(space.record_dtype), tuple(space.record_shape)
    name = leaf_name(leaf.key)
    x = b.op(Input(input_name(leaf.key, dtype), leaf.key, dtype.str, shape))
    if fam == "box" and len(shape) == 3:
        return _encode_image(b, spec, leaf.key, x, space, shape, dtype)
    if fam == "box":
        x = _encode_vector_box(b, name, x, space, shape, dtype)
    elif fam == "multi_binary":
        x = b.flatten(b.op(Cast(f"{name}/f32", x)), name, shape)
        b.width[x] = space.n
    else:  # discrete, multi_discrete: one-hot of value - start per component
        nvec = (space.n,) if fam == "discrete" else tuple(space.nvec)
        start = (space.start,) if fam == "discrete" else tuple(space.start)
        if fam == "discrete":
            x = b.op(Flatten(f"{name}/flat", x))
        columns = tuple(c for c, n in enumerate(nvec) for _ in range(n))
        values = tuple(int(s) + v for s, n in zip(start, nvec) for v in range(n))
        x = b.op(OneHot(f"{name}/onehot", x, columns, values), len(columns))
    if spec.encoder_hidden_sizes:
        x = b.mlp(x, f"{name}/mlp", spec.encoder_hidden_sizes, spec.activation, None)
    return x


def _actor_pieces(b: _Builder, spec: Any, head: str, mask: str) -> list[str]:
    """Cut the actor head into the dist-inputs layout, leaf by leaf."""
    pieces: list[str] = []
    offset = mask_offset = 0
    leaves = spec.act_space.leaves()
    for leaf in leaves:
        fam, width = family(leaf.space), head_width(leaf.space, spec.box_dist)
        piece = head
        if len(leaves) > 1:
            piece = b.op(Slice(f"pi.head/{leaf.key}", head, offset, offset + width), width)
        offset += width
        if fam in ("discrete", "multi_discrete") and mask:
            stop = mask_offset + width
            piece = b.op(Mask(f"pi.masked/{leaf.key}", piece, mask, mask_offset, stop), width)
            mask_offset = stop
        pieces.append(piece)
        if fam == "box" and spec.box_dist == "squashed_gaussian":
            pieces[-1:] = _squashed_pieces(b, leaf.key, piece, width // 2)
        elif fam == "box":
            name = "log_std" if leaf.key == "" else f"log_std.{leaf.key}"
            log_std = b.param(name, (width,), "fill", spec.log_std_init)
            pieces.append(b.op(Tile(f"{name}/batch", piece, log_std), width))
    return pieces


def _squashed_pieces(b: _Builder, key: str, piece: str, d: int) -> list[str]:
    """A squashed Gaussian's head columns [N, 2d]: the means, then the log-stds clipped."""
    mean = b.op(Slice(f"pi.mean/{key}", piece, 0, d), d)
    raw = b.op(Slice(f"pi.log_std/{key}", piece, d, 2 * d), d)
    return [mean, b.op(Clip(f"pi.log_std.clipped/{key}", raw, *LOG_STD_RANGE), d)]


def head_width(space: Any, box_dist: str = "gaussian") -> int:
    """Actor-head columns of one action leaf: Box prod(shape) means (squashed Gaussian: means
    and log-stds), else its logits."""
    if family(space) == "box" and box_dist != "squashed_gaussian":
        return int(space.action_width)
    return int(space.dist_width)


def lower(spec: Any) -> Net:
    """The op list and parameter declarations of `spec` (a PolicySpec). Called once per spec
    (PolicySpec caches it). ValueError when a CNN does not fit or names collide."""
    b = _Builder()
    features = [_encode_leaf(b, spec, leaf) for leaf in spec.feature_leaves()]
    x = features[0]
    if len(features) > 1:
        x = b.op(Concat("features", tuple(features)), sum(b.width[f] for f in features))
    mask = ""
    if spec.action_mask_key:
        leaf = spec.mask_leaf()
        dtype, shape = np.dtype(leaf.space.record_dtype), tuple(leaf.space.record_shape)
        mask = b.flatten(b.op(Input(input_name(leaf.key, dtype), leaf.key, dtype.str, shape)),
                         leaf_name(leaf.key), shape)
    if spec.recurrent != "none":
        x = _recurrent_core(b, spec.recurrent, spec.recurrent_size, x)
    total = sum(head_width(leaf.space, spec.box_dist) for leaf in spec.act_space.leaves())
    head = b.mlp(x, "pi", spec.hidden_sizes, spec.activation, (total, 0.01, "pi.head"))
    pieces = _actor_pieces(b, spec, head, mask)
    if len(pieces) == 1:  # the single piece becomes the output (flat Discrete: the head Gemm)
        b.ops[-1] = _renamed(b.ops[-1], DIST)
    else:
        b.op(Concat(DIST, tuple(pieces)))
    b.mlp(x, "vf", spec.hidden_sizes, spec.activation, (1, 1.0, VALUE))
    _check_unique(b)
    return Net(tuple(b.ops), tuple(b.params))


def _recurrent_core(b: _Builder, cell: str, size: int, x: str) -> str:
    """State input, the cell (orthogonal weights gain 1, zero biases) and its hidden part."""
    gates, width = GATES[cell], state_width(cell, size)
    state = b.op(State(STATE_IN, width), width)
    w_ih = b.param("rnn.weight_ih", (gates * size, b.width[x]), "orthogonal", 1.0)
    w_hh = b.param("rnn.weight_hh", (gates * size, size), "orthogonal", 1.0)
    b_ih = b.param("rnn.bias_ih", (gates * size,), "zeros")
    b_hh = b.param("rnn.bias_hh", (gates * size,), "zeros")
    b.op(Recurrent(STATE_OUT, x, state, cell, size, w_ih, w_hh, b_ih, b_hh), width)
    return b.op(Slice("rnn.h", STATE_OUT, 0, size), size)


def network_json(net: Net, comps: Sequence[Any], outputs: Iterable[str] = (DIST,)) -> dict:
    """The ops `outputs` need, every parameter of the flat vector and the action distribution's
    components (`distributions.components`), as plain JSON: what a client that interprets the
    description itself (the C client's MLP forward and sampling) reads.

        {"ops": [{"op": "Linear", "out": "pi.0.pre", "x": "obs/norm", "weight": "pi.0.weight",
                  "bias": "pi.0.bias"}, ...],                     (execution order)
         "params": [["obs_mean", [4]], ["obs_std", [4]], ...],    (flat-vector order)
         "dist": [{"kind": "categorical", "dist": 0, "width": 2, "action": 0,
                   "low": [], "high": []}, ...]}                  (bounds: null = infinite)

    Each op is its dataclass fields plus "op" (the class name); tuples become lists. Sent in
    ATTACHED (shared-memory clients) beside `policy_spec`; derived, never a second source."""
    ops = []
    for op in net.needed(outputs):
        entry: dict[str, Any] = {"op": type(op).__name__}
        for f in fields(op):  # type: ignore[arg-type]
            value = getattr(op, f.name)
            entry[f.name] = list(value) if isinstance(value, tuple) else value
        ops.append(entry)
    dist = [{"kind": c.kind, "dist": c.dist, "width": c.width, "action": c.action,
             "low": [_finite_or_none(v) for v in c.low], "high": [_finite_or_none(v) for v in c.high]}
            for c in comps]
    return {"ops": ops, "params": [[p.name, list(p.shape)] for p in net.params], "dist": dist}


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None

def _renamed(op: Op, out: str) -> Op:
    return type(op)(**{**{f.name: getattr(op, f.name) for f in fields(op)},  # type: ignore
                       "out": out})


def _check_unique(b: _Builder) -> None:
    names = [op.out for op in b.ops] + [p.name for p in b.params]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"observation keys give clashing network names {dupes}; rename a key "
                         f"(a key ending in _mean/_std next to its stem clashes)")


def orthogonal(rng: np.random.Generator, shape: tuple[int, ...], gain: float) -> np.ndarray:
    """An orthogonal matrix [shape[0], prod(shape[1:])] scaled by gain, reshaped to `shape`
    (what torch.nn.init.orthogonal_ does)."""
    rows, cols = shape[0], math.prod(shape[1:])
    q, r = np.linalg.qr(rng.standard_normal((max(rows, cols), min(rows, cols))))
    q = q * np.sign(np.diag(r))  # make the decomposition unique (uniform over orthogonal)
    return (gain * (q if rows >= cols else q.T)).reshape(shape)

