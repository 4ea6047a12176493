"""direct.c's wire text checked against the Python codec (client_lib/protocol) before use.

native/direct.c writes the ``ACTION`` / ``ACTIONS`` reply of a plain step with ``snprintf``
and reads plain steps with its own small JSON grammar; the message types and keys come from
declared.h (generated from the Python declarations), but the shape of the text is C's own.
``disagreement`` runs the native object on sample inputs and compares with the codec: every
reply frame must have a valid header and decode (``codec.decode_body``) equal to the message
the Python path sends; every sample plain step, as the codec encodes it or spelled by hand,
must parse to the fields the codec decodes; every sample of a message the native path must
not take (an end, a start, several entries, an unknown key, an escape) must be declined.
``FastPath.maybe`` (fastpath.py) calls it when the role starts: a disagreement refuses the
native path (logged with its reason; direct.py then serves every message), so a format that
drifted can cost speed but never send a wrong reply. Pure: no sockets, no lanes.
"""
from __future__ import annotations

from typing import Any

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol import serving as s
from rlinkd.client_lib.protocol.wire import ProtocolError

OBS = [0.1, -0.2, 0.3, 4.5]
REPLIES = [(False, "ep-1", 1, 7), (True, "a", 0, 0), (False, "x" * 64, -1, 2**40), (True, "q.9_Z", 123456789, 1)]
"""(STEP_BATCH, episode id, action, weights_seq_no) of the sample replies."""
PLAIN_STEPS: list[bytes] = [
    codec.encode(s.Step("ep-1", 1.5, OBS))[8:],
    codec.encode(s.Step("e", -0.0, [1e-3, 2.5e10]))[8:],
    codec.encode(s.StepBatch((s.BatchEntry("a", OBS, reward=-2.0),)))[8:],
    b'{ "observation" : [1, -2E0, 0.25] , "reward": 3, "episode_id":"b", "type" : "STEP" }',
    b'{"type":"STEP","episode_id":"c","reward":0.5,"observation":[0],"terminated":false,"truncated":false}',
]
"""Plain steps the native path must take, with the fields the codec decodes."""
NOT_PLAIN: list[bytes] = [
    codec.encode(s.Step("ep-1", 1.0, OBS, terminated=True))[8:],
    codec.encode(s.StepBatch((s.BatchEntry("a", OBS, start=True),)))[8:],
    codec.encode(s.StepBatch((s.BatchEntry("a", OBS, reward=1.0), s.BatchEntry("b", OBS, reward=1.0))))[8:],
    codec.encode(s.GetAction("ep-1", OBS))[8:],
    b'{"type":"STEP","episode_id":"e","reward":1,"observation":[1],"extra":1}',
    b'{"type":"STEP","episode_id":"e\\u0041","reward":1,"observation":[1]}',
]
"""Valid serving messages (and near misses) the native path must give back to direct.py."""


def _expected_reply(batch: bool, episode_id: str, action: int, seq: int) -> s.Message:
    return s.Actions([action], [seq]) if batch else s.Action(episode_id, action, seq)


def reply_disagreement(native: Any) -> str | None:
    """The first sample reply whose frame is not what the codec would decode it as, else None."""
    for batch, episode_id, action, seq in REPLIES:
        frame = native.format_reply(batch, episode_id.encode(), action, seq)
        want = _expected_reply(batch, episode_id, action, seq)
        try:
            body = frame[codec.HEADER_BYTES:]
            if codec.parse_header(frame[:codec.HEADER_BYTES], 1 << 20) != len(body):
                return f"reply {want!r}: the header does not give the body's length"
            got = codec.decode_body(body)
        except ProtocolError as exc:
            return f"reply {want!r}: the codec refuses {frame!r}: {exc}"
        if got != want:
            return f"reply {want!r}: {frame!r} decodes as {got!r}"
    return None


def _plain_fields(msg: s.Message) -> tuple:
    """(batch, episode id, reward, observation) of a plain step as the codec decoded it."""
    if isinstance(msg, s.StepBatch):
        entry = msg.steps[0]
        reward = float("nan") if entry.reward is None else float(entry.reward)  # (a start: no reward)
        return True, entry.episode_id.encode(), reward, tuple(float(x) for x in entry.observation)
    assert isinstance(msg, s.Step)
    return False, msg.episode_id.encode(), float(msg.reward), tuple(float(x) for x in msg.observation)


def grammar_disagreement(native: Any) -> str | None:
    """The first sample body the native grammar reads otherwise than the codec, else None."""
    for body in PLAIN_STEPS:
        got, want = native.parse(body), _plain_fields(codec.decode_body(body))
        if got != want:
            return f"plain step {body!r}: native {got!r}, codec {want!r}"
    for body in NOT_PLAIN:
        if (got := native.parse(body)) is not None:
            return f"{body!r} is not a plain step, the native grammar read {got!r}"
    return None


def disagreement(native: Any) -> str | None:
    """Why direct.c's native object must not serve (its replies or grammar differ from the
    codec's, or it predates these checks), else None."""
    if not (hasattr(native, "format_reply") and hasattr(native, "parse")):
        return "the extension was built without DirectNative.format_reply/parse: rebuild it"
    return reply_disagreement(native) or grammar_disagreement(native)
