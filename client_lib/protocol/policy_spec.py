"""The policy every rlinkd process agrees on: spaces in, one network description out.

`PolicySpec` names the observation and action spaces and the architecture knobs; from them
`netops.lower` derives THE description of the network (an op list plus the parameter
declarations). Everything else is derived from that one description:

    param_layout()          (name, shape) of every tensor of the flat float32 weight vector
                            the learner publishes (order = declaration order in the op list)
    init_flat(rng)          CleanRL-style initial weights
    NumpyNet / actor_forward / value_forward     numpy forward (netnumpy)
    build_onnx_model / OnnxWeightWriter          the ONNX model clients run (netonnx)
    rlinkd.daemon.learner.model.ActorCritic      the torch twin the learner trains
    sample_actions / greedy_actions / log_prob / entropy    numpy distributions

Parameter layout for a flat float Box observation and a Discrete or Box action (unchanged
from the MLP-only rlinkd; the torch, numpy and ONNX forwards all read this order):
    obs_mean [F], obs_std [F]                     observation normaliser (identity: 0 / 1)
    pi.{i}.weight [out, in], pi.{i}.bias [out]    actor MLP, last layer = the actor head
    log_std [A]                                   Box actions only
    vf.{i}.weight [out, in], vf.{i}.bias [out]    critic MLP, last layer width 1
Composite spaces add, per observation leaf and before `pi.*`: "<leaf>_mean"/"<leaf>_std"
(normalised leaves), "<leaf>/conv.{i}.weight|bias" and "<leaf>/dense.weight|bias" (images),
"<leaf>/mlp.{i}.weight|bias" (encoder_hidden_sizes), where <leaf> is "obs" for a root leaf,
else "obs.<key>"; a recurrent spec then "rnn.weight_ih", "rnn.weight_hh", "rnn.bias_ih",
"rnn.bias_hh" (`recurrent`); and per Box action leaf "log_std" (root) or "log_std.<key>".

`action_dist_inputs` layout: per action leaf, in leaf order — Discrete: n logits;
MultiDiscrete: nvec[0] logits, nvec[1] logits, ...; MultiBinary: n Bernoulli logits;
Box: prod(shape) means then prod(shape) log-stds. Masked logits are MASKED_LOGIT (-1e9).
Everything here is numpy (+ onnx inside functions): a simulator never loads torch.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol import netops, recurrent
from rlinkd.client_lib.protocol.distributions import ActionDist, Component, components
from rlinkd.client_lib.protocol.masking import mask_spec
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.netonnx import (ONNX_IR_VERSION, ONNX_OPSET, OnnxWeightWriter,
                                                build_onnx_model)
from rlinkd.client_lib.protocol.netops import ACTIVATIONS, DIST, VALUE, Net, leaf_name
from rlinkd.client_lib.protocol.spaces import Leaf, Space, space_from_json

ONNX_INPUT_NAME = netops.ROOT_FLOAT_INPUT  # the input name RLlib's ONNX clients feed
ONNX_OUTPUT_NAME = DIST
__all__ = [
    "ONNX_INPUT_NAME",
    "ONNX_IR_VERSION",
    "ONNX_OPSET",
    "ONNX_OUTPUT_NAME",
    "NormalizedLeaf",
    "NumpyNet",
    "OnnxWeightWriter",
    "PolicySpec",
    "build_onnx_model",
]
_TUPLE_FIELDS = ("hidden_sizes", "cnn_channels", "cnn_kernels", "cnn_strides",
                 "encoder_hidden_sizes")


@dataclass(frozen=True)
class NormalizedLeaf:
    """An observation leaf the network normalises: the learner folds the leaf's values,
    as float64 reshaped to [N, *shape], into running statistics and copies them into the
    `mean`/`std` parameters."""
    key: str
    mean: str
    std: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class PolicySpec:
    """An actor-critic for `obs_space` -> `act_space`, described well enough to build,
    serialise and run it anywhere.

    hidden_sizes/activation: the separate pi and vf MLP trunks over the concatenated leaf
    features. cnn_*: the conv stack for every image (rank-3 Box, HWC) leaf — empty means
    the Nature CNN (32 8x8/4, 64 4x4/2, 64 3x3/1, dense 512) when min(H, W) >= 36, else a
    small one (16 3x3/1 [+ 32 3x3/1 when it fits], dense 128); cnn_strides empty = all 1;
    cnn_dense 0 = that default width. encoder_hidden_sizes: an MLP on each non-image leaf
    before the trunk (default none). action_mask_key: a top-level MultiBinary key of a Dict
    observation masking the categorical action logits ("" = none). recurrent: "none" (a
    feed-forward network), "lstm" or "gru": a cell of hidden size recurrent_size after the
    encoders, with state inputs/outputs (`recurrent`, `netops.STATE_IN`/`STATE_OUT`);
    max_seq_len L: the training chunk length of a recurrent policy, and so the grid on which
    a training fragment carries the actor's state (before its steps 0, L, 2L, ...:
    `recurrent.state_rows`). Construction raises ValueError (SpaceError is one) on an inconsistent description.
    """

    obs_space: Space
    act_space: Space
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    log_std_init: float = 0.0
    cnn_channels: tuple[int, ...] = ()
    cnn_kernels: tuple[int, ...] = ()
    cnn_strides: tuple[int, ...] = ()
    cnn_dense: int = 0
    encoder_hidden_sizes: tuple[int, ...] = ()
    action_mask_key: str = ""
    box_dist: str = "gaussian"
    recurrent: str = "none"
    recurrent_size: int = 64
    max_seq_len: int = 20

    def __post_init__(self) -> None:
        for name in _TUPLE_FIELDS:
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        object.__setattr__(self, "log_std_init", float(self.log_std_init))
        if self.recurrent == "none":  # a feed-forward spec has no recurrent sizes to differ in
            for f in fields(self):
                if f.name in ("recurrent_size", "max_seq_len"):
                    object.__setattr__(self, f.name, f.default)
        self._validate()
        object.__setattr__(self, "_dist", ActionDist(components(self.act_space, self.box_dist)))
        object.__setattr__(self, "_net", netops.lower(self))

    def _validate(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, not {self.activation!r}")
        if any(h < 1 for h in self.hidden_sizes + self.encoder_hidden_sizes + self.cnn_channels
               + self.cnn_kernels + self.cnn_strides) or self.cnn_dense < 0:
            raise ValueError("hidden sizes, cnn channels/kernels/strides must be positive")
        if len(self.cnn_kernels) != len(self.cnn_channels) or (
                self.cnn_strides and len(self.cnn_strides) != len(self.cnn_channels)):
            raise ValueError("cnn_kernels (and cnn_strides, if given) need one entry per "
                             "cnn_channels entry")
        if self.recurrent not in ("none", *netops.CELLS):
            raise ValueError(f"recurrent must be 'none' or one of {netops.CELLS}, "
                             f"not {self.recurrent!r}")
        if self.recurrent_size < 1:
            raise ValueError("recurrent_size must be positive")
        if self.max_seq_len < 1:
            raise ValueError("max_seq_len must be positive")
        mask_spec(self.obs_space, self.act_space, self.action_mask_key)
        if not self.feature_leaves():
            raise ValueError("the observation space has no leaf besides the action mask")

    # ----------------------------------------------------------------- description
    @property
    def net(self) -> Net:
        """The lowered network (built once, at construction)."""
        return self._net  # type: ignore[attr-defined]

    def ops(self) -> tuple[netops.Op, ...]:
        return self.net.ops

    def feature_leaves(self) -> tuple[Leaf, ...]:
        """Observation leaves encoded into features (all but the action mask)."""
        return tuple(leaf for leaf in self.obs_space.leaves()
                     if not self.action_mask_key or leaf.key != self.action_mask_key)

    def mask_leaf(self) -> Leaf:
        """The action-mask leaf; KeyError without action_mask_key."""
        return self.obs_space.leaf(self.action_mask_key)

    def normalizers(self) -> tuple[NormalizedLeaf, ...]:
        """The leaves with a normaliser, in leaf order (float/int Boxes other than uint8
        images and bool)."""
        shapes = dict(self.param_layout())
        out = []
        for leaf in self.feature_leaves():
            mean, std = f"{leaf_name(leaf.key)}_mean", f"{leaf_name(leaf.key)}_std"
            if mean in shapes:
                out.append(NormalizedLeaf(leaf.key, mean, std, shapes[mean]))
        return tuple(out)

    @property
    def action_components(self) -> tuple[Component, ...]:
        return self.action_dist.comps

    @property
    def action_dist(self) -> ActionDist:
        return self._dist  # type: ignore[attr-defined]

    @property
    def action_size(self) -> int:
        """Width of the float32 action (index) vector."""
        return self.action_dist.action_size

    @property
    def dist_size(self) -> int:
        """Width of `action_dist_inputs` (the layout is in the module docstring)."""
        return int(self.act_space.dist_size)

    @property
    def state_size(self) -> int:
        """S, the width of a recurrent policy's state ("state_in"/"state_out"); 0 when
        feed-forward (also the width of the step records' state field)."""
        if self.recurrent == "none":
            return 0
        return recurrent.state_width(self.recurrent, self.recurrent_size)

    def state_contract(self) -> dict | None:
        """The additive "state" key of SET_CONFIG/ATTACHED and the export sidecar
        (`recurrent.state_contract`); None for a feed-forward policy (the key is absent)."""
        if self.recurrent == "none":
            return None
        return recurrent.state_contract(self.recurrent, self.recurrent_size, self.max_seq_len)

    @property
    def obs_size(self) -> int:
        """Elements of one observation over the feature leaves (flat Box: its size).
        Transitional: what the MLP-era learner reshapes a flat obs batch to."""
        return sum(math.prod(leaf.space.record_shape) for leaf in self.feature_leaves())

    @property
    def is_box(self) -> bool:
        """Every action component is Gaussian (float actions). Transitional, as obs_size."""
        return all(c.kind.endswith("gaussian") for c in self.action_components)

    def to_json(self) -> dict:
        """A plain JSON-safe dict; inverse of from_json."""
        d: dict[str, Any] = {"obs_space": self.obs_space.to_json(),
                             "act_space": self.act_space.to_json()}
        for name in ("activation", "log_std_init", "cnn_dense", "action_mask_key"):
            d[name] = getattr(self, name)
        if self.box_dist != "gaussian":  # (omitted by default: older clients read the rest)
            d["box_dist"] = self.box_dist
        if self.recurrent != "none":  # (omitted when feed-forward, as box_dist)
            d["recurrent"], d["recurrent_size"] = self.recurrent, self.recurrent_size
            d["max_seq_len"] = self.max_seq_len
        return {**d, **{name: list(getattr(self, name)) for name in _TUPLE_FIELDS}}

    @classmethod
    def from_json(cls, d: dict) -> PolicySpec:
        """Build from a to_json() dict; unknown keys raise TypeError, bad values ValueError."""
        rest = {k: v for k, v in d.items() if k not in ("obs_space", "act_space")}
        return cls(space_from_json(d["obs_space"]), space_from_json(d["act_space"]), **rest)

    # ----------------------------------------------------------------- flat weights
    def param_layout(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every tensor in the order of the shared flat float32 vector."""
        return [(p.name, p.shape) for p in self.net.params]

    def n_params(self) -> int:
        return sum(math.prod(p.shape) for p in self.net.params)

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
        """Fresh float32 weights, CleanRL style: orthogonal weights (hidden and conv gain
        sqrt 2, actor head 0.01, critic head 1.0; conv kernels flattened to [out, in*k*k]),
        zero biases, identity normalisers, log_std = log_std_init."""
        flat = np.zeros(self.n_params(), dtype=np.float32)
        params = self.split_flat(flat)
        for p in self.net.params:
            if p.init == "fill":
                params[p.name][...] = p.value
            elif p.init == "orthogonal":
                params[p.name][...] = netops.orthogonal(rng, p.shape, p.value)
        return flat

    # ----------------------------------------------------------------- numpy forward
    def as_obs(self, obs: Mapping[str, np.ndarray] | np.ndarray) -> Mapping[str, np.ndarray]:
        """Observations as leaf key -> array; a bare array is accepted for a root leaf."""
        if isinstance(obs, Mapping):
            return obs
        if self.obs_space.leaves()[0].key != "":
            raise ValueError("a composite observation must be a dict of leaf key -> array")
        return {"": np.asarray(obs)}

    def actor_forward(self, flat: np.ndarray, obs: Mapping[str, np.ndarray] | np.ndarray
                      ) -> np.ndarray:
        """Distribution inputs [N, dist_size] float32 (binds `flat` per call: callers running
        many batches on one weights version should keep a NumpyNet)."""
        return NumpyNet(self, flat, (DIST,)).run(self.as_obs(obs))[DIST]

    def value_forward(self, flat: np.ndarray, obs: Mapping[str, np.ndarray] | np.ndarray
                      ) -> np.ndarray:
        """State values [N] float32."""
        return NumpyNet(self, flat, (VALUE,)).run(self.as_obs(obs))[VALUE][:, 0]

    # ----------------------------------------------------------------- distributions
    def sample_actions(self, dist_inputs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """float32 [N, action_size] index vectors drawn from the product distribution."""
        return self.action_dist.sample(dist_inputs, rng)

    def greedy_actions(self, dist_inputs: np.ndarray) -> np.ndarray:
        """float32 [N, action_size]: the mode of every component (Box: clipped mean)."""
        return self.action_dist.greedy(dist_inputs)

    def log_prob(self, dist_inputs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """log pi(a|s) [N] float32 (sum over components) at actions [N, action_size]."""
        return self.action_dist.log_prob(dist_inputs, actions)

    def entropy(self, dist_inputs: np.ndarray) -> np.ndarray:
        """Entropy [N] float32 (sum over components)."""
        return self.action_dist.entropy(dist_inputs)


# Module-level spellings of the numpy helpers, `f(spec, ...) == spec.f(...)`, for callers that
# hold the spec as data (the connector pipeline uses these).
def actor_forward(spec: PolicySpec, flat: np.ndarray, obs: Any) -> np.ndarray:
    return spec.actor_forward(flat, obs)


def value_forward(spec: PolicySpec, flat: np.ndarray, obs: Any) -> np.ndarray:
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
