"""rlinkd's network as RLlib's default PPO torch RLModule: the config a msgpack-flavour client
builds it from, and the weights under that module's parameter names (pure; no ray, no torch).

RLlib >= 2.49's client unpickles SET_CONFIG's ``config`` (an AlgorithmConfig), builds
``config.get_rl_module_spec().build()`` and loads SET_STATE's ``state.rl_module`` into it
with ``strict=False``: a wrong name would be ignored silently, so the names here are checked
against ones recorded from the real module (tests/fixtures/rllib_msgpack/ray-*/module.json,
ray 2.49.0 and 2.60.0: ``DefaultPPOTorchRLModule`` with ``vf_share_layers=False``).

``config_pickle`` writes that config's pickle by hand, opcode by opcode: it names RLlib's
and gymnasium's classes but imports neither (nothing here can unpickle; the client trusts
the server for the config, as it does with RLlib's own server). The pickle makes
``PPOConfig()`` and sets four attributes: the spaces, ``rollout_fragment_length`` and
``_model_config`` ``{fcnet_hiddens, fcnet_activation, vf_share_layers: False,
head_fcnet_hiddens: []}``.

Served networks (``rllib_net_error`` says why another is not): a rank-1 float Box
observation and a Discrete (start 0) or float rank-1 Box action (Gaussian), at least one
hidden layer, no ``encoder_hidden_sizes``, CNN, action mask or recurrent cell. Mapping (``rllib_state``):
``pi.i``/``vf.i`` hidden layers -> ``encoder.{actor,critic}_encoder.net.mlp.{2i}``; the
heads -> ``{pi,vf}.net.mlp.0``; the observation normaliser is folded into the first layer
(W / std, b - W @ (mean / std)); a Box action's state-independent log-std becomes the
bias of the head's second half, whose weights are zero (RLlib's head emits means and
log-stds; it clips log-stds to +-20, ``LOG_STD_CLIP``).
"""
from __future__ import annotations

import struct

import numpy as np

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Discrete, Space

LOG_STD_CLIP = 20.0  # RLlib's DefaultModelConfig.log_std_clip_param (a buffer of each head)
PPO_CONFIG = ("ray.rllib.algorithms.ppo.ppo", "PPOConfig")


def rllib_net_error(spec: PolicySpec) -> str | None:
    """None when ``spec`` has RLlib's default-module form, else why not."""
    obs, act = spec.obs_space, spec.act_space
    if not (isinstance(obs, Box) and obs.is_float and len(obs.shape) == 1):
        return "the observation space must be a rank-1 float Box"
    if not (isinstance(act, Discrete) and act.start == 0) and not (
            isinstance(act, Box) and act.is_float and len(act.shape) == 1):
        return "the action space must be Discrete (start 0) or a rank-1 float Box"
    if spec.box_dist != "gaussian" or spec.encoder_hidden_sizes or spec.action_mask_key:
        return "the network must be the plain PPO MLP (no encoder MLP, action mask or SAC head)"
    if not spec.hidden_sizes:
        return "the network needs at least one hidden layer"
    if spec.recurrent != "none":
        return "the network is recurrent (RLlib's default PPO module is feed-forward)"
    return None


def rllib_state(spec: PolicySpec, flat: np.ndarray) -> dict[str, np.ndarray]:
    """``flat`` (rlinkd's parameter vector) under the RLModule's names, float32."""
    p = {k: np.asarray(v, np.float64) for k, v in spec.split_flat(flat).items()}
    mean, std = p["obs_mean"], p["obs_std"]
    out: dict[str, np.ndarray] = {}
    n = len(spec.hidden_sizes)
    for trunk, encoder in (("pi", "actor_encoder"), ("vf", "critic_encoder")):
        for i in range(n):
            w, b = p[f"{trunk}.{i}.weight"], p[f"{trunk}.{i}.bias"]
            if i == 0:  # (x - mean) / std folded in: W x / std - W mean / std + b
                w = w / std                                  # [H, obs]
                b = b - w @ mean                             # [H]
            out[f"encoder.{encoder}.net.mlp.{2 * i}.weight"] = w
            out[f"encoder.{encoder}.net.mlp.{2 * i}.bias"] = b
        w, b = p[f"{trunk}.{n}.weight"], p[f"{trunk}.{n}.bias"]
        if trunk == "pi" and isinstance(spec.act_space, Box):
            w = np.concatenate([w, np.zeros_like(w)])       # [2A, H]: means, then log-stds
            b = np.concatenate([b, p["log_std"]])           # [2A]
        out[f"{trunk}.net.mlp.0.weight"], out[f"{trunk}.net.mlp.0.bias"] = w, b
        out[f"{trunk}.log_std_clip_param_const"] = np.array([LOG_STD_CLIP])
    return {k: v.astype(np.float32) for k, v in out.items()}


def config_pickle(spec: PolicySpec, rollout_fragment_length: int) -> bytes:
    """Pickle (protocol 2) of a PPOConfig for ``spec``'s spaces and MLP (see module doc)."""
    w = _Pickle()
    w.call(PPO_CONFIG, [])
    w.dict_of({"observation_space": lambda: _space(w, spec.obs_space),
               "action_space": lambda: _space(w, spec.act_space),
               "rollout_fragment_length": lambda: w.value(int(rollout_fragment_length)),
               "_model_config": lambda: w.value({
                   "fcnet_hiddens": list(spec.hidden_sizes), "fcnet_activation": spec.activation,
                   "vf_share_layers": False, "head_fcnet_hiddens": []})})
    w.out += b"b."  # BUILD (the attributes into the new object's __dict__), STOP
    return bytes(w.out)


def _space(w: _Pickle, space: Space) -> None:
    """gymnasium.spaces.Box(low, high, None, dtype) / Discrete(n)."""
    if isinstance(space, Discrete):
        w.call(("gymnasium.spaces.discrete", "Discrete"), [lambda: w.value(space.n)])
        return
    if not isinstance(space, Box):
        raise ValueError(f"no RLlib form for {type(space).__name__} (see rllib_net_error)")
    dtype = np.dtype(space.dtype).name
    bounds = [lambda b=b: w.call(("numpy", "array"), [lambda: w.value([float(v) for v in b]),
                                                     lambda: w.value(dtype)])
              for b in (space.low, space.high)]
    w.call(("gymnasium.spaces.box", "Box"), [*bounds, lambda: w.value(None), lambda: w.value(dtype)])


class _Pickle:
    """Pickle opcodes for a few value kinds (protocol 2: understood by every Python 3)."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")  # PROTO 2

    def call(self, where: tuple[str, str], args: list) -> None:
        """GLOBAL module name, the arguments as a tuple, REDUCE."""
        self.out += b"c%s\n%s\n" % (where[0].encode(), where[1].encode()) + b"("
        for emit in args:
            emit()
        self.out += b"tR"

    def dict_of(self, items: dict) -> None:
        self.out += b"}("
        for key, emit in items.items():
            self.value(key)
            emit()
        self.out += b"u"

    def value(self, v: object) -> None:
        if v is None or isinstance(v, bool):
            self.out += {None: b"N", True: b"\x88", False: b"\x89"}[v]
        elif isinstance(v, int):
            self.out += b"J" + struct.pack("<i", v)
        elif isinstance(v, float):
            self.out += b"G" + struct.pack(">d", v)
        elif isinstance(v, str):
            data = v.encode()
            self.out += b"X" + struct.pack("<I", len(data)) + data
        elif isinstance(v, list):
            self.out += b"]("
            for item in v:
                self.value(item)
            self.out += b"e"
        elif isinstance(v, dict):
            self.dict_of({k: (lambda x=x: self.value(x)) for k, x in v.items()})
        else:
            raise TypeError(f"no pickle opcode for {type(v).__name__}")
