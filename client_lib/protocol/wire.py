"""The RLlink vocabulary every message module shares: message types, the ``Message`` base,
the errors a bad frame raises, and the checked field read. ``codec`` (the seed's messages,
framing) and ``serving`` (the serving extensions) both build on it; it imports neither.
"""
from __future__ import annotations

import enum
from dataclasses import fields
from typing import Any, ClassVar

F32_MAX = 3.4028234663852886e38
"""The largest float32. Step records and serving lanes hold rewards and observations as
float32: a finite number beyond this would become infinite there, so it is refused."""


class ProtocolError(ValueError):
    """The peer sent something that is not valid RLlink. The message says what."""


class BadHeader(ProtocolError):
    """The 8-byte length header is not eight ASCII digits."""


class FrameTooLarge(ProtocolError):
    """The header announces a body larger than the configured maximum."""


class BadMessage(ProtocolError):
    """The body is not a JSON object with a known type and well-formed fields."""


class MessageType(str, enum.Enum):
    """RLlink message types; the last group are rlinkd extensions."""

    PING = "PING"
    PONG = "PONG"
    GET_CONFIG = "GET_CONFIG"
    SET_CONFIG = "SET_CONFIG"
    GET_STATE = "GET_STATE"
    SET_STATE = "SET_STATE"
    EPISODES = "EPISODES"
    EPISODES_AND_GET_STATE = "EPISODES_AND_GET_STATE"
    ERROR = "ERROR"
    # rlinkd extensions
    STATUS = "STATUS"
    STATUS_REPORT = "STATUS_REPORT"
    ATTACH = "ATTACH"
    ATTACHED = "ATTACHED"
    SAMPLE_READY = "SAMPLE_READY"
    WEIGHTS_READY = "WEIGHTS_READY"
    # rlinkd serving, evaluation and metrics extensions (declared in protocol.serving)
    START_EPISODE = "START_EPISODE"
    EPISODE_STARTED = "EPISODE_STARTED"
    GET_ACTION = "GET_ACTION"
    ACTION = "ACTION"
    LOG_RETURNS = "LOG_RETURNS"
    END_EPISODE = "END_EPISODE"
    STEP = "STEP"
    STEP_BATCH = "STEP_BATCH"
    ACTIONS = "ACTIONS"
    EVAL_RESULTS = "EVAL_RESULTS"
    METRICS = "METRICS"
    SERVE_ATTACH = "SERVE_ATTACH"
    SERVE_ATTACHED = "SERVE_ATTACHED"
    SERVE_DIRECT = "SERVE_DIRECT"
    SERVE_DIRECT_READY = "SERVE_DIRECT_READY"


# ---------------------------------------------------------------- messages
class Message:
    """Base of typed messages: ``to_body()`` gives the JSON object to send."""

    TYPE: ClassVar[MessageType]

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"type": self.TYPE.value}
        names = _FIELD_NAMES.get(type(self))
        if names is None:  # (dataclasses.fields costs ~3 us a call: once per class)
            names = _FIELD_NAMES[type(self)] = tuple(f.name for f in fields(self))  # type: ignore[arg-type]
        for name in names:
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        return body


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _brief(value: Any) -> str:
    """A peer's value for an error message: bounded, and never the repr of a JSON array or
    object (JSON nests up to 1024 levels; repr() of that overflows the stack)."""
    if isinstance(value, (list, dict)):
        return f"<JSON {'array' if isinstance(value, list) else 'object'}>"
    return repr(value[:64] if isinstance(value, str) else value)[:80]


def _get(obj: dict, key: str, kinds: tuple[type, ...], *, required: bool = True,
         default: Any = None, where: str | None = None) -> Any:
    """``obj[key]`` checked against ``kinds``; errors name ``where`` (default: the type)."""
    where = where or str(obj.get("type"))
    if key not in obj or obj[key] is None:
        if required:
            raise BadMessage(f"{where}: missing field {key!r}")
        return default
    value = obj[key]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = "/".join(k.__name__ for k in kinds)
        raise BadMessage(f"{where}: field {key!r} must be {names}")
    return value
