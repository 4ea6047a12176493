"""RLlink's msgpack flavour (the one RLlib >= 2.49's own clients speak), sans-IO, decoded
without running any code the peer sent.

Frame: the same 8-digit length header as ``codec``; the body is msgpack (str and bin kept
apart), a map with a str ``type``. Numpy arrays travel as msgpack-numpy maps::

    {b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [4], b"data": <16 bytes>}
    {b"nd": False, b"type": "<f8", b"data": <8 bytes>}        (a numpy scalar)

msgpack-numpy's own decoder unpickles a map whose ``kind`` is ``b"O"``; this module never
does. ``unpack`` runs plain msgpack with ``_array_hook``, which accepts only the two map
forms above with a numeric dtype of ``ARRAY_DTYPES``, at most ``MAX_DIMS`` dimensions and
exactly ``prod(shape) * itemsize`` data bytes (so an array is never larger than the frame
that carried it); object and void arrays, extension types (timestamps included) and nesting
deeper than ``MAX_DEPTH`` are a ``BadMsgpack``: ERROR to that client. The first body byte
tells the flavours apart (``is_msgpack``): a JSON object starts with ``{``, a msgpack map
with 0x80-0x8f, 0xde or 0xdf.

Requests become ``codec`` messages (PING, GET_CONFIG, GET_STATE, EPISODES,
EPISODES_AND_GET_STATE); episodes arrive as ``SingleAgentEpisode.get_state()`` maps and
become ``codec.EpisodeFragment``s (``episode_fragment``), which the collector validates
exactly like RLlink JSON episodes.
"""
from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.agents import id_error
from rlinkd.client_lib.protocol.codec import BadMessage

MAP_FIRST_BYTES = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}
ARRAY_DTYPES = frozenset({"<f2", "<f4", "<f8", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4",
                          "<u8", "|b1"})
MAX_DIMS = 8
MAX_DEPTH = 32  # SingleAgentEpisode states nest 5 deep; a Dict observation adds its own levels
_ARRAY_KEYS = frozenset({b"nd", b"type", b"kind", b"shape", b"data"})
_SCALAR_KEYS = frozenset({b"nd", b"type", b"data"})
_PLAIN = (type(None), bool, int, float, str, bytes, np.ndarray, np.generic)


class BadMsgpack(BadMessage):
    """The body is not msgpack this server decodes (malformed, or a refused type)."""


def is_msgpack(body: bytes) -> bool:
    """Whether a frame body is a msgpack map (else it is taken for JSON)."""
    return len(body) > 0 and body[0] in MAP_FIRST_BYTES


# ---------------------------------------------------------------- decoding
def unpack(body: bytes) -> dict:
    """One body → its map, arrays as read-only-free numpy copies. Raises BadMsgpack."""
    if not is_msgpack(body):
        raise BadMsgpack("body is not a msgpack map (this connection speaks msgpack)")
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True, object_hook=_array_hook,
                              ext_hook=_refuse_ext, timestamp=0)
    except BadMessage:
        raise
    except msgpack.ExtraData:
        raise BadMsgpack("trailing bytes after the body's map") from None
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # truncated, bad UTF-8, keys
        raise BadMsgpack(f"body is not valid msgpack: {str(exc)[:120] or type(exc).__name__}") from None
    _check_tree(obj)
    return obj


def _refuse_ext(code: int, data: bytes) -> Any:
    raise BadMsgpack(f"msgpack extension type {code} is refused")


def _array_hook(d: dict) -> Any:
    """A msgpack-numpy map → ndarray (or numpy scalar); every other map unchanged."""
    if b"nd" not in d:
        return d
    nd = d[b"nd"]
    if nd is True and d.keys() == _ARRAY_KEYS:
        if d[b"kind"] != b"":
            raise BadMsgpack(f"array of kind {_brief(d[b'kind'])} refused (only numeric arrays)")
        dtype, shape = _dtype(d[b"type"]), _shape(d[b"shape"])
        return _from_bytes(d[b"data"], dtype, math.prod(shape)).reshape(shape)
    if nd is False and d.keys() == _SCALAR_KEYS:
        return _from_bytes(d[b"data"], _dtype(d[b"type"]), 1)[0]
    raise BadMsgpack("malformed array map (expected msgpack-numpy's nd/type/kind/shape/data)")


def _dtype(value: Any) -> np.dtype:
    if not isinstance(value, str) or value not in ARRAY_DTYPES:
        raise BadMsgpack(f"array dtype {_brief(value)} refused (allowed: "
                         f"{', '.join(sorted(ARRAY_DTYPES))})")
    return np.dtype(value)


def _shape(value: Any) -> tuple[int, ...]:
    if (not isinstance(value, list) or len(value) > MAX_DIMS or not all(
            type(n) is int and n >= 0 for n in value)):
        raise BadMsgpack(f"array shape must be a list of at most {MAX_DIMS} sizes >= 0")
    return tuple(value)


def _from_bytes(data: Any, dtype: np.dtype, count: int) -> np.ndarray:
    if not isinstance(data, bytes) or count * dtype.itemsize != len(data):
        raise BadMsgpack(f"array data holds {len(data) if isinstance(data, bytes) else 'no'} "
                         f"bytes, its shape and dtype need {count * dtype.itemsize}")
    return np.frombuffer(data, dtype).copy()


def _check_tree(obj: Any) -> None:
    """Only plain values, lists and maps, nested at most MAX_DEPTH deep (iterative walk)."""
    todo = [(obj, 1)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, (list, dict)):
            if depth > MAX_DEPTH:
                raise BadMsgpack(f"nesting deeper than {MAX_DEPTH} levels")
            items = value.values() if isinstance(value, dict) else value
            todo.extend((v, depth + 1) for v in items)
        elif not isinstance(value, _PLAIN):
            raise BadMsgpack(f"{type(value).__name__} values are refused")


def _brief(value: Any) -> str:
    return repr(value[:32] if isinstance(value, (str, bytes)) else type(value).__name__)[:48]


def decode_body(body: bytes) -> codec.Message:
    """A request of RLlib's msgpack client as a ``codec`` message; BadMessage naming the problem."""
    obj = unpack(body)
    kind = obj.get("type")
    if kind == "PING":
        token = obj.get("token")
        if token is not None and not isinstance(token, str):
            raise BadMessage("PING: field 'token' must be str")
        return codec.Ping(token=token)
    if kind == "GET_CONFIG":
        return codec.GetConfig()
    if kind == "GET_STATE":
        return codec.GetState()
    if kind in ("EPISODES", "EPISODES_AND_GET_STATE"):
        return _episodes(obj, codec.Episodes if kind == "EPISODES" else codec.EpisodesAndGetState)
    raise BadMessage(f"unknown message type {_brief(kind) if not isinstance(kind, str) else repr(kind[:64])}"
                     " (msgpack flavour: PING, GET_CONFIG, GET_STATE, EPISODES, "
                     "EPISODES_AND_GET_STATE)")


def _episodes(obj: dict, cls: type) -> codec.Episodes:
    raw = obj.get("episodes")
    if not isinstance(raw, list):
        raise BadMessage(f"{obj['type']}: missing field 'episodes' (a list)")
    frags = tuple(episode_fragment(e, i) for i, e in enumerate(raw))
    total = sum(f.num_steps for f in frags)
    count = obj.get("timesteps", obj.get("env_steps"))
    if count is not None and (type(count) is not int or count != total):
        raise BadMessage(f"{obj['type']}: env_steps/timesteps says {_brief(count) if type(count) is not int else count}"
                         f" but the episodes hold {total} steps")
    return cls(episodes=frags, env_steps=total)


def episode_fragment(state: Any, index: int) -> codec.EpisodeFragment:
    """One ``SingleAgentEpisode.get_state()`` map → the steps it adds (its lookback dropped:
    those steps came with the chunk before). Structural checks only, as ``codec.decode_fragment``."""
    where = f"episodes[{index}]"
    if not isinstance(state, dict):
        raise BadMessage(f"{where} must be a map (a SingleAgentEpisode state)")
    if state.get("agent_id") is not None:
        raise BadMessage(f"{where}: multi-agent episodes are not served in the msgpack flavour")
    extra = state.get("extra_model_outputs") or {}
    if not isinstance(extra, dict):
        raise BadMessage(f"{where}.extra_model_outputs must be a map")
    frag = codec.EpisodeFragment(
        obs=_steps(state, "observations", where), actions=_steps(state, "actions", where),
        rewards=_numbers(_steps(state, "rewards", where), f"{where}.rewards"),
        is_terminated=_flag(state, "is_terminated", where),
        is_truncated=_flag(state, "is_truncated", where),
        action_logp=_optional(extra, "action_logp", f"{where}.extra_model_outputs"),
        action_dist_inputs=_optional(extra, "action_dist_inputs", f"{where}.extra_model_outputs"),
        episode_id=_episode_id(state, where))
    codec.check_lengths(frag, where)
    return frag


def _steps(state: dict, key: str, where: str) -> Any:
    """An InfiniteLookbackBuffer state ``{data, lookback, ...}``: its data after the lookback."""
    buf = state.get(key)
    if not isinstance(buf, dict):
        raise BadMessage(f"{where}: missing field {key!r} (a lookback buffer map)")
    data, lookback = buf.get("data"), buf.get("lookback", 0)
    if not isinstance(data, (list, np.ndarray)) or (isinstance(data, np.ndarray) and data.ndim == 0):
        raise BadMessage(f"{where}.{key}.data must be a list or an array (Box/Discrete spaces)")
    if type(lookback) is not int or not 0 <= lookback <= len(data):
        raise BadMessage(f"{where}.{key}.lookback must be an integer in 0..len(data)")
    return data[lookback:]


def _numbers(value: Any, what: str) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):
        raise BadMessage(f"{what} is ragged (rows of different lengths)") from None
    if arr.dtype.kind not in "biuf":
        raise BadMessage(f"{what} must hold only numbers")
    return arr.astype(np.float64, copy=False)


def _optional(extra: dict, key: str, where: str) -> np.ndarray | None:
    if extra.get(key) is None:
        return None
    return _numbers(_steps(extra, key, where), f"{where}.{key}")


def _flag(state: dict, key: str, where: str) -> bool:
    value = state.get(key)
    if not isinstance(value, bool):
        raise BadMessage(f"{where}: field {key!r} must be bool")
    return value


def _episode_id(state: dict, where: str) -> str | None:
    value = state.get("id_")
    error = None if value is None else id_error(value, f"{where}.id_")
    if error:
        raise BadMessage(error)
    return value


# ---------------------------------------------------------------- encoding
def encode(message: dict[str, Any]) -> bytes:
    """Header + msgpack body as one bytes object; arrays as msgpack-numpy maps."""
    body = msgpack.packb(message, use_bin_type=True, default=_encode_array)
    if len(body) > codec.MAX_ENCODABLE_BYTES:
        raise codec.ProtocolError(f"message of {len(body)} bytes does not fit an 8-digit header")
    return b"%08d" % len(body) + body


def _encode_array(obj: Any) -> Any:
    if isinstance(obj, np.ndarray) and obj.dtype.str in ARRAY_DTYPES:
        return {b"nd": True, b"type": obj.dtype.str, b"kind": b"", b"shape": list(obj.shape),
                b"data": np.ascontiguousarray(obj).tobytes()}
    if isinstance(obj, np.generic) and obj.dtype.str in ARRAY_DTYPES:
        return {b"nd": False, b"type": obj.dtype.str, b"data": obj.tobytes()}
    raise TypeError(f"cannot send {type(obj).__name__} in the msgpack flavour")


def error_frame(message: str) -> bytes:
    """ERROR in this flavour (RLlib's client has no ERROR type: it drops the connection)."""
    return encode({"type": "ERROR", "message": message[:1000]})
