"""RLlink codec, sans-IO: bytes in, typed messages out (and back). Shared by server and client.

Frame layout (exactly as the RLlink seed specifies)::

    offset 0          8                          8+N
           +----------+--------------------------+
           | 00000016 | {"type": "PING"}         |
           +----------+--------------------------+
           header: N as 8 ASCII decimal digits, zero-padded
           body:   N bytes of UTF-8 JSON, an object with a string "type"

``HEADER`` is the one struct constant for it. A header announcing more than
``max_message_bytes`` is refused by ``parse_header`` before any body byte is read.

Messages are frozen dataclasses keyed by ``MessageType``; the core never passes
bare dicts. Extensions only ever *add* keys to the seed's messages (SET_CONFIG:
``observation_space``, ``action_space``, ``protocol_version``, ``compact_arrays``, ``policies``,
``policy_mapping``, ``max_agents_per_connection``, ``box_dist``; SET_STATE: ``onnx_sha256``, ``policies``;
episodes: ``agent_id``, ``episode_id``, ``policy_id``, ``state_in``; SET_CONFIG and
ATTACHED: ``state`` for a recurrent policy; PING: ``token``) or add new message types that a plain client
never receives unless it sends them first, so a client written from the seed
alone works unchanged.
"""
from __future__ import annotations

import struct
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

import numpy as np
import orjson

from rlinkd.client_lib.protocol.agents import MAX_POLICIES, POLICY_NAME, id_error
from rlinkd.client_lib.protocol.compact import CompactError, decode_compact, is_compact
from rlinkd.client_lib.protocol.serving import DECODERS as _SERVING_DECODERS
from rlinkd.client_lib.protocol.wire import (BadHeader, BadMessage, FrameTooLarge, Message, MessageType,
                                            ProtocolError, _brief, _get)

HEADER = struct.Struct("8s")
HEADER_BYTES = HEADER.size
MAX_ENCODABLE_BYTES = 99_999_999  # eight decimal digits
PROTOCOL_VERSION = 3  # 2: composite spaces, compact arrays; 3: agents and policies
_NUMERIC_KINDS = frozenset("biuf")


@dataclass(frozen=True)
class Ping(Message):
    TYPE: ClassVar = MessageType.PING
    token: str | None = None


@dataclass(frozen=True)
class Pong(Message):
    TYPE: ClassVar = MessageType.PONG


@dataclass(frozen=True)
class GetConfig(Message):
    TYPE: ClassVar = MessageType.GET_CONFIG


@dataclass(frozen=True)
class SetConfig(Message):
    TYPE: ClassVar = MessageType.SET_CONFIG
    env_steps_per_sample: int
    force_on_policy: bool
    observation_space: dict | None = None
    action_space: dict | None = None
    protocol_version: int | None = None
    compact_arrays: bool | None = None
    policies: dict | None = None          # {name: {observation_space, action_space, trainable}}
    policy_mapping: list | None = None    # [[agent-id pattern, policy name], ...]
    max_agents_per_connection: int | None = None
    box_dist: str | None = None  # "squashed_gaussian": SAC's Box actions (absent: "gaussian")
    state: dict | None = None  # recurrent default policy: ``recurrent.state_contract`` (absent: none)


@dataclass(frozen=True)
class GetState(Message):
    TYPE: ClassVar = MessageType.GET_STATE
    weights_seq_nos: dict | None = None  # {policy: version the client holds}: ONNX only if newer


@dataclass(frozen=True)
class SetState(Message):
    TYPE: ClassVar = MessageType.SET_STATE
    weights_seq_no: int
    onnx_file: str
    onnx_sha256: str | None = None
    policies: dict | None = None  # {name: {weights_seq_no, onnx_file?, onnx_sha256?}}
    exploration: dict | None = None  # {policy: {"epsilon": e}}: DQN policies' epsilon-greedy rate


@dataclass(frozen=True)
class EpisodeFragment:
    """One episode (or a piece of one) as it travels: obs has one more step than actions.

    ``obs`` and ``actions`` hold the JSON value as received (or as built for sending): a
    list of per-step values, a columnar object, or compact arrays (``protocol.columns`` says
    which forms; the collector converts them against its spaces). A fragment that is neither
    terminated nor truncated is continued by the same connection's next fragment, whose
    first observation repeats this one's last.
    """

    obs: Any                   # T+1 steps of the observation space
    actions: Any               # T steps of the action space
    rewards: np.ndarray        # [T] float64 as parsed
    is_terminated: bool
    is_truncated: bool
    action_logp: np.ndarray | None = None         # [T]
    action_dist_inputs: np.ndarray | None = None  # [T, D]
    agent_id: str | None = None    # multi-agent extension: whose episode (None: the only agent)
    episode_id: str | None = None  # multi-agent extension: which of that agent's episodes
    policy_id: str | None = None   # multi-agent extension: the policy that acted (None: mapping)
    state_in: Any = None  # recurrent policies: [K, S], the actor's state before steps 0, L,
    #                       2L, ... (``protocol.recurrent``); an array once decoded

    @property
    def num_steps(self) -> int:
        return len(self.rewards)

    def to_json(self) -> dict[str, Any]:
        d = {"obs": _json_array(self.obs), "actions": _json_array(self.actions),
             "rewards": _json_array(self.rewards),
             "is_terminated": self.is_terminated, "is_truncated": self.is_truncated}
        if self.action_logp is not None:
            d["action_logp"] = _json_array(self.action_logp)
        if self.action_dist_inputs is not None:
            d["action_dist_inputs"] = _json_array(self.action_dist_inputs)
        if self.state_in is not None:
            d["state_in"] = _json_array(self.state_in)
        for key in ("agent_id", "episode_id", "policy_id"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d


def _json_array(value: Any) -> Any:
    """orjson serialises only C-contiguous arrays; views (slices, transposes) get a copy."""
    return np.ascontiguousarray(value) if isinstance(value, np.ndarray) else value


@dataclass(frozen=True)
class Episodes(Message):
    TYPE: ClassVar = MessageType.EPISODES
    episodes: tuple[EpisodeFragment, ...]
    env_steps: int | None = None
    weights_seq_no: int | None = None
    weights_seq_nos: dict | None = None  # {policy: version the client holds}

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"type": self.TYPE.value, "episodes": [e.to_json() for e in self.episodes],
                "env_steps": sum(e.num_steps for e in self.episodes)}
        if self.weights_seq_no is not None:
            body["weights_seq_no"] = self.weights_seq_no
        if self.weights_seq_nos is not None:
            body["weights_seq_nos"] = self.weights_seq_nos
        return body

    @property
    def num_steps(self) -> int:
        return sum(e.num_steps for e in self.episodes)


@dataclass(frozen=True)
class EpisodesAndGetState(Episodes):
    TYPE: ClassVar = MessageType.EPISODES_AND_GET_STATE


@dataclass(frozen=True)
class Error(Message):
    TYPE: ClassVar = MessageType.ERROR
    message: str


@dataclass(frozen=True)
class Status(Message):
    TYPE: ClassVar = MessageType.STATUS
    token: str | None = None


@dataclass(frozen=True)
class StatusReport(Message):
    TYPE: ClassVar = MessageType.STATUS_REPORT
    status: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Attach(Message):
    """shm extension: a co-located client asks for a ring (see client_lib.shm_client)."""

    TYPE: ClassVar = MessageType.ATTACH
    pid: int
    capacity_records: int | None = None
    token: str | None = None
    policy: str | None = None  # multi-agent: the ring for this policy's agents (None: default)


@dataclass(frozen=True)
class Attached(Message):
    """shm extension reply: the ring's name, where the weights board is, and their layout.

    The ring itself is no file: right after this frame the daemon sends one byte,
    ``RING_FD_BYTE``, carrying the ring's sealed memfd as SCM_RIGHTS ancillary data
    (exactly one descriptor). Read this frame exactly, then that byte with ``recvmsg``.
    """

    TYPE: ClassVar = MessageType.ATTACHED
    ring_name: str
    board_path: str
    doorbell_path: str
    layout: dict
    policy_spec: dict
    env_steps_per_sample: int
    force_on_policy: bool
    policy: str | None = None  # the policy whose ring, board and network these are
    network: dict | None = None  # the actor's lowered ops + the flat parameter layout
    #                              (``netops.network_json``): for clients that interpret it
    state: dict | None = None  # recurrent policy: ``recurrent.state_contract`` (absent: none)


RING_FD_BYTE = b"\x01"
"""The one data byte that carries the ring's descriptor after ATTACHED (see ``Attached``)."""


@dataclass(frozen=True)
class SampleReady(Message):
    """shm extension: the client's ring holds a complete sample (EPISODES_AND_GET_STATE
    for shared memory). Reply: WEIGHTS_READY once the board holds the weights to use."""

    TYPE: ClassVar = MessageType.SAMPLE_READY
    env_steps: int
    get_state: bool = True


@dataclass(frozen=True)
class WeightsReady(Message):
    """shm extension reply: read weights ``weights_seq_no`` (or newer) from the board."""

    TYPE: ClassVar = MessageType.WEIGHTS_READY
    weights_seq_no: int
    weights_seq_nos: dict | None = None  # multi-policy: {policy: version to read (or newer)}
    exploration: dict | None = None  # as in SET_STATE


def epsilon_of(exploration: dict | None, policy: str) -> float | None:
    """``policy``'s epsilon in an ``exploration`` extension (None: sample the policy's
    distribution as usual). RLlinkError-free: a malformed entry means no epsilon."""
    entry = (exploration or {}).get(policy)
    value = entry.get("epsilon") if isinstance(entry, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
        return float(value)
    return None


# ---------------------------------------------------------------- encoding
def encode(msg: Message) -> bytes:
    """Header + body as ONE bytes object (so a sender makes a single write)."""
    return encode_body(msg.to_body())


def encode_body(body: dict[str, Any]) -> bytes:
    return frame(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY))


def frame(data: bytes) -> bytes:
    """One frame: the 8-digit length header, then ``data``."""
    if len(data) > MAX_ENCODABLE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes does not fit an 8-digit header")
    return b"%08d" % len(data) + data


def parse_header(header: bytes, max_message_bytes: int) -> int:
    """Body length announced by an 8-byte header; refuses oversize before any body read."""
    if len(header) != HEADER_BYTES or not header.isdigit():
        raise BadHeader(f"bad frame header {bytes(header)[:8]!r}: expected 8 ASCII digits")
    n = int(header)
    if n > max_message_bytes:
        raise FrameTooLarge(f"frame of {n} bytes exceeds max_message_bytes={max_message_bytes}")
    return n


class FrameDecoder:
    """Incremental splitter: feed bytes, take complete frame bodies.

    For bytes that arrive in arbitrary chunks; the tests and the live fuzzer's oracle use
    it (the daemon's servers read frames with asyncio instead). Raises ``ProtocolError``
    as soon as a header is bad or too large.
    """

    def __init__(self, max_message_bytes: int) -> None:
        self.max_message_bytes = max_message_bytes
        self._buf = bytearray()
        self._need: int | None = None

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_body(self) -> bytes | None:
        if self._need is None:
            if len(self._buf) < HEADER_BYTES:
                return None
            self._need = parse_header(bytes(self._buf[:HEADER_BYTES]), self.max_message_bytes)
            del self._buf[:HEADER_BYTES]
        if len(self._buf) < self._need:
            return None
        body = bytes(self._buf[:self._need])
        del self._buf[:self._need]
        self._need = None
        return body

    def next_message(self) -> Message | None:
        body = self.next_body()
        return None if body is None else decode_body(body)


# ---------------------------------------------------------------- decoding
def decode_body(body: bytes) -> Message:
    """Parse and type-check one frame body; raises BadMessage naming the problem."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadMessage(f"body is not valid UTF-8 JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadMessage(f"body must be a JSON object, got {type(obj).__name__}")
    kind = obj.get("type")
    try:
        if not isinstance(kind, str):  # MessageType(kind) would repr() a nested value
            raise ValueError
        mtype = MessageType(kind)
    except ValueError:
        raise BadMessage(f"unknown message type {_brief(kind)}") from None
    return _DECODERS[mtype](obj)


def _numeric_array(value: Any, what: str) -> np.ndarray:
    """A JSON list (or compact array) → numpy float64 array; refuses ragged, nested-object
    or string data."""
    if is_compact(value):
        try:
            return decode_compact(value, what).astype(np.float64)
        except CompactError as exc:
            raise BadMessage(str(exc)) from None
    if not isinstance(value, list):
        raise BadMessage(f"{what} must be a list")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):
        raise BadMessage(f"{what} is ragged (rows of different lengths)") from None
    if arr.dtype.kind not in _NUMERIC_KINDS:
        raise BadMessage(f"{what} must hold only numbers")
    return arr.astype(np.float64, copy=False)


def decode_fragment(obj: Any, index: int) -> EpisodeFragment:
    """One element of ``episodes``; structural checks only (spaces are the collector's)."""
    where = f"episodes[{index}]"
    if not isinstance(obj, dict):
        raise BadMessage(f"{where} must be an object")
    obs = _get(obj, "obs", (list, dict), where=where)
    actions = _get(obj, "actions", (list, dict), where=where)
    rewards = _numeric_array(_get(obj, "rewards", (list, dict), where=where), f"{where}.rewards")
    frag = EpisodeFragment(
        obs=obs, actions=actions, rewards=rewards,
        is_terminated=_get(obj, "is_terminated", (bool,), where=where),
        is_truncated=_get(obj, "is_truncated", (bool,), where=where),
        action_logp=_optional_array(obj, "action_logp", where),
        action_dist_inputs=_optional_array(obj, "action_dist_inputs", where),
        agent_id=_optional_id(obj, "agent_id", where),
        episode_id=_optional_id(obj, "episode_id", where),
        policy_id=_optional_id(obj, "policy_id", where),
        state_in=_optional_array(obj, "state_in", where))
    check_lengths(frag, where)
    return frag


def _optional_id(obj: dict, key: str, where: str) -> str | None:
    """An agent, episode or policy id (``protocol.agents`` limits), or None when absent."""
    value = obj.get(key)
    if value is None:
        return None
    error = id_error(value, f"{where}.{key}")
    if error:
        raise BadMessage(error)
    return value


def _optional_array(obj: dict, key: str, where: str) -> np.ndarray | None:
    value = obj.get(key)
    return None if value is None else _numeric_array(value, f"{where}.{key}")


def check_lengths(f: EpisodeFragment, where: str) -> None:
    """obs has len(rewards)+1 entries (list form), actions and dist outputs len(rewards)."""
    t = len(f.rewards)
    if f.rewards.ndim != 1:
        raise BadMessage(f"{where}.rewards must be a flat list of numbers")
    if isinstance(f.obs, list) and len(f.obs) != t + 1:  # other forms: checked by the spaces
        raise BadMessage(f"{where}: obs has {len(f.obs)} entries, expected len(rewards)+1 = {t + 1}")
    if isinstance(f.actions, list) and len(f.actions) != t:
        raise BadMessage(f"{where}: actions has {len(f.actions)} entries, rewards {t}")
    for name in ("action_logp", "action_dist_inputs"):
        arr = getattr(f, name)
        if arr is not None and len(arr) != t:
            raise BadMessage(f"{where}: {name} has {len(arr)} entries, rewards {t}")
    # terminated and truncated may both be true (gymnasium: the pole falls on the step the
    # time limit hits); terminated wins downstream: no bootstrap from the final obs.


def _decode_episodes(obj: dict, cls: type) -> Episodes:
    raw = _get(obj, "episodes", (list,))
    frags = tuple(decode_fragment(e, i) for i, e in enumerate(raw))
    count = obj.get("env_steps", obj.get("timesteps"))
    total = sum(f.num_steps for f in frags)
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count != total):
        raise BadMessage(f"{obj['type']}: env_steps/timesteps says {_brief(count)} but the "
                         f"episodes hold {total} steps")
    seq = _get(obj, "weights_seq_no", (int,), required=False)
    if seq is not None and not -2**63 <= seq < 2**63:  # step records store it as int64
        raise BadMessage(f"{obj['type']}: weights_seq_no {seq} does not fit 64 bits")
    return cls(episodes=frags, env_steps=total, weights_seq_no=seq,
               weights_seq_nos=_seq_nos(obj))


def _seq_nos(obj: dict) -> dict | None:
    """``weights_seq_nos``: {policy name: int}, at most MAX_POLICIES entries, or None."""
    value = _get(obj, "weights_seq_nos", (dict,), required=False)
    if value is None:
        return None
    if len(value) > MAX_POLICIES or not all(
            isinstance(k, str) and POLICY_NAME.fullmatch(k) and isinstance(v, int)
            and not isinstance(v, bool) and -2**63 <= v < 2**63 for k, v in value.items()):
        raise BadMessage(f"{obj['type']}: weights_seq_nos must map at most {MAX_POLICIES} "
                         "policy names to integers")
    return value


def _decode_simple(cls: type) -> Any:
    """Decoder for a message whose fields are scalars/objects listed in _FIELD_KINDS."""
    def decode(obj: dict) -> Message:
        kwargs = {}
        for f in fields(cls):
            required = f.default is MISSING and f.default_factory is MISSING
            default = f.default_factory() if f.default_factory is not MISSING else (
                None if f.default is MISSING else f.default)
            kwargs[f.name] = _get(obj, f.name, _FIELD_KINDS.get(f.name, (str,)),
                                  required=required, default=default)
        return cls(**kwargs)
    return decode


_FIELD_KINDS: dict[str, tuple[type, ...]] = {
    "token": (str,), "env_steps_per_sample": (int,), "force_on_policy": (bool,),
    "observation_space": (dict,), "action_space": (dict,), "protocol_version": (int,),
    "compact_arrays": (bool,),
    "weights_seq_no": (int,), "onnx_file": (str,), "onnx_sha256": (str,), "message": (str,),
    "status": (dict,), "pid": (int,), "capacity_records": (int,), "ring_name": (str,),
    "board_path": (str,), "doorbell_path": (str,), "layout": (dict,), "policy_spec": (dict,), "env_steps": (int,),
    "get_state": (bool,), "policies": (dict,), "policy_mapping": (list,),
    "max_agents_per_connection": (int,), "weights_seq_nos": (dict,), "policy": (str,),
    "exploration": (dict,), "box_dist": (str,), "network": (dict,), "state": (dict,),
}

_DECODERS: dict[MessageType, Any] = {
    MessageType.EPISODES: lambda o: _decode_episodes(o, Episodes),
    MessageType.EPISODES_AND_GET_STATE: lambda o: _decode_episodes(o, EpisodesAndGetState),
}
for _cls in (Ping, Pong, GetConfig, SetConfig, SetState, Error, Status, StatusReport,
             Attach, Attached, SampleReady, WeightsReady):
    _DECODERS[_cls.TYPE] = _decode_simple(_cls)
_DECODERS[MessageType.GET_STATE] = lambda o: GetState(weights_seq_nos=_seq_nos(o))

# The serving messages (their own module) decode through the same table.
_DECODERS.update(_SERVING_DECODERS)
