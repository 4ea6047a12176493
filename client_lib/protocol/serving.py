"""RLlink serving, evaluation and metrics messages (rlinkd extensions), declared once.

Server-side inference: a client that runs no policy asks the daemon for actions and
reports only rewards and done flags; the daemon records observation, action, log-prob and
weights version itself, so the steps train exactly like client-side data. Names follow
RLlib's old ``PolicyClient`` (start_episode / get_action / log_returns / end_episode, with
``training_enabled``) so users of it recognise them; ``STEP`` and ``STEP_BATCH`` are
rlinkd's own: one round trip per step, and one per step of many agents.

    START_EPISODE  {episode_id?, training_enabled?, agent_id?, policy_id?} -> EPISODE_STARTED {episode_id, policy_id}
    GET_ACTION     {episode_id, observation}                            -> ACTION {episode_id, action, weights_seq_no}
    LOG_RETURNS    {episode_id, reward}                    (no reply; rewards add up until the next step)
    END_EPISODE    {episode_id, observation, terminated?=true, truncated?=false}   (no reply)
    STEP           {episode_id, reward, observation, terminated?, truncated?}      -> ACTION (action null if it ended)
    STEP_BATCH     {steps: [{episode_id, observation, reward?, terminated?, truncated?,
                             start?, training_enabled?, agent_id?, policy_id?}, ...]}
                                                                           -> ACTIONS {actions: [...], weights_seq_nos}
    EVAL_RESULTS   {episodes: [{episode_return, episode_length, weights_seq_no?, policy_id?, agent_id?}]}  (no reply)
    METRICS        {metrics: {name: number}}                               (no reply)
    SERVE_ATTACH   {pid, lanes, policy?, token?}                           -> SERVE_ATTACHED + 3 fds (shm lanes)
    SERVE_DIRECT   {}                                                      -> SERVE_DIRECT_READY, then the
                   connection's serving messages are answered by the inference process itself

A ``STEP_BATCH`` entry with ``start: true`` starts episode ``episode_id`` with its first
observation (no reward); one with ``terminated`` or ``truncated`` ends it (its action is
null). Every error is an ERROR frame to that client only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rlinkd.client_lib.protocol.agents import id_error
from rlinkd.client_lib.protocol.wire import F32_MAX, BadMessage, Message, MessageType, _brief, _get

MAX_BATCH_STEPS = 4096
"""Entries in one STEP_BATCH (and actions in one ACTIONS)."""
MAX_EVAL_EPISODES = 1024
"""Entries in one EVAL_RESULTS."""
MAX_METRICS_PER_MESSAGE = 64
METRIC_NAME_CHARS = 64
LANE_FD_COUNT = 3
"""SERVE_ATTACHED is followed by one byte carrying three fds: lane area, request doorbell,
response doorbell (in that order)."""


@dataclass(frozen=True)
class StartEpisode(Message):
    TYPE: ClassVar = MessageType.START_EPISODE
    episode_id: str | None = None       # None: the daemon names it
    training_enabled: bool | None = None  # False: an evaluation episode (greedy, never trained)
    agent_id: str | None = None         # picks the policy through [policy_mapping]
    policy_id: str | None = None        # or names it directly


@dataclass(frozen=True)
class EpisodeStarted(Message):
    TYPE: ClassVar = MessageType.EPISODE_STARTED
    episode_id: str
    policy_id: str | None = None


@dataclass(frozen=True)
class GetAction(Message):
    TYPE: ClassVar = MessageType.GET_ACTION
    episode_id: str
    observation: Any


@dataclass(frozen=True)
class Action(Message):
    TYPE: ClassVar = MessageType.ACTION
    episode_id: str
    action: Any                # the action in its JSON form; None when the episode ended
    weights_seq_no: int = -1   # the policy version that chose it

    def to_body(self) -> dict[str, Any]:
        """``action`` is always present: null (not absent) for an ended episode."""
        return {"type": self.TYPE.value, "episode_id": self.episode_id, "action": self.action,
                "weights_seq_no": self.weights_seq_no}


@dataclass(frozen=True)
class LogReturns(Message):
    TYPE: ClassVar = MessageType.LOG_RETURNS
    episode_id: str
    reward: float


@dataclass(frozen=True)
class EndEpisode(Message):
    TYPE: ClassVar = MessageType.END_EPISODE
    episode_id: str
    observation: Any
    terminated: bool = True
    truncated: bool = False


@dataclass(frozen=True)
class Step(Message):
    """Reward for the last action + the next observation -> the next action."""

    TYPE: ClassVar = MessageType.STEP
    episode_id: str
    reward: float
    observation: Any
    terminated: bool = False
    truncated: bool = False


@dataclass(frozen=True)
class BatchEntry:
    """One agent's step in a STEP_BATCH: a start, a step or an end."""

    episode_id: str
    observation: Any
    reward: float | None = None
    terminated: bool = False
    truncated: bool = False
    start: bool = False
    training_enabled: bool | None = None
    agent_id: str | None = None
    policy_id: str | None = None

    @property
    def ends(self) -> bool:
        return self.terminated or self.truncated

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"episode_id": self.episode_id, "observation": self.observation}
        for key in ("reward", "training_enabled", "agent_id", "policy_id"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        for key in ("terminated", "truncated", "start"):
            if getattr(self, key):
                d[key] = True
        return d


@dataclass(frozen=True)
class StepBatch(Message):
    TYPE: ClassVar = MessageType.STEP_BATCH
    steps: tuple[BatchEntry, ...]

    def to_body(self) -> dict[str, Any]:
        return {"type": self.TYPE.value, "steps": [s.to_json() for s in self.steps]}


@dataclass(frozen=True)
class Actions(Message):
    TYPE: ClassVar = MessageType.ACTIONS
    actions: list              # one per STEP_BATCH entry, in order; None for ended episodes
    weights_seq_nos: list      # the version that chose each action (-1 for None)


@dataclass(frozen=True)
class EvalEpisode:
    episode_return: float
    episode_length: int
    weights_seq_no: int = -1
    policy_id: str | None = None
    agent_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = {"episode_return": self.episode_return, "episode_length": self.episode_length,
             "weights_seq_no": self.weights_seq_no}
        for key in ("policy_id", "agent_id"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d


@dataclass(frozen=True)
class EvalResults(Message):
    """Finished evaluation episodes (greedy, never trained): returns for ``eval/*``."""

    TYPE: ClassVar = MessageType.EVAL_RESULTS
    episodes: tuple[EvalEpisode, ...]

    def to_body(self) -> dict[str, Any]:
        return {"type": self.TYPE.value, "episodes": [e.to_json() for e in self.episodes]}


@dataclass(frozen=True)
class Metrics(Message):
    """Client-reported scalars (RELAAX's ``metrics.scalar``): TensorBoard ``client/<name>``."""

    TYPE: ClassVar = MessageType.METRICS
    metrics: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ServeAttach(Message):
    """shm extension: a co-located client asks for a lane area (server-side inference)."""

    TYPE: ClassVar = MessageType.SERVE_ATTACH
    pid: int
    lanes: int
    policy: str | None = None
    token: str | None = None


@dataclass(frozen=True)
class ServeAttached(Message):
    """Reply to SERVE_ATTACH; followed by one byte carrying LANE_FD_COUNT descriptors."""

    TYPE: ClassVar = MessageType.SERVE_ATTACHED
    area_name: str
    lanes: int
    layout: dict       # the lane area's layout (shm.lanes.LaneLayout.to_json())
    policy: str
    observation_space: dict
    action_space: dict


@dataclass(frozen=True)
class ServeDirect(Message):
    """A TCP (not TLS) or Unix-socket client asks that the inference process answer this
    connection itself: one hop per action instead of two (through the collector). The
    client sends nothing more until SERVE_DIRECT_READY; from then on the connection carries
    only START_EPISODE, GET_ACTION, LOG_RETURNS, END_EPISODE, STEP, STEP_BATCH and PING.
    An ERROR instead (TLS, episodes already open, the role cannot take it) closes the
    connection like any refused request: the client connects again and stays with the
    collector."""

    TYPE: ClassVar = MessageType.SERVE_DIRECT


@dataclass(frozen=True)
class ServeDirectReady(Message):
    TYPE: ClassVar = MessageType.SERVE_DIRECT_READY


# ---------------------------------------------------------------- decoding
def _episode_id(obj: dict, where: str, required: bool = True) -> str | None:
    value = obj.get("episode_id")
    if value is None and not required:
        return None
    error = id_error(value, f"{where}.episode_id")
    if error:
        raise BadMessage(error)
    return value


def _opt_id(obj: dict, key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    error = id_error(value, f"{where}.{key}")
    if error:
        raise BadMessage(error)
    return value


def _finite(obj: dict, key: str, where: str, required: bool = True) -> float | None:
    value = _get(obj, key, (int, float), required=required, where=where)
    if value is None:
        return None
    if isinstance(value, bool) or not math.isfinite(value):
        raise BadMessage(f"{where}: {key} must be a finite number")
    return float(value)


def _reward(obj: dict, where: str, required: bool = True) -> float | None:
    """A finite reward that float32 holds (the lane's reward field is float32)."""
    value = _finite(obj, "reward", where, required)
    if value is not None and abs(value) > F32_MAX:
        raise BadMessage(f"{where}: reward {value!r} is beyond the float32 range")
    return value


def _flag(obj: dict, key: str, where: str, default: bool = False) -> bool:
    return bool(_get(obj, key, (bool,), required=False, default=default, where=where))


def _observation(obj: dict, where: str) -> Any:
    if "observation" not in obj or obj["observation"] is None:
        raise BadMessage(f"{where}: missing field 'observation'")
    return obj["observation"]


def _decode_start(obj: dict) -> StartEpisode:
    w = "START_EPISODE"
    return StartEpisode(episode_id=_episode_id(obj, w, required=False),
                        training_enabled=_get(obj, "training_enabled", (bool,), required=False, where=w),
                        agent_id=_opt_id(obj, "agent_id", w), policy_id=_opt_id(obj, "policy_id", w))


def _decode_get_action(obj: dict) -> GetAction:
    return GetAction(_episode_id(obj, "GET_ACTION"), _observation(obj, "GET_ACTION"))  # type: ignore[arg-type]


def _decode_log_returns(obj: dict) -> LogReturns:
    return LogReturns(_episode_id(obj, "LOG_RETURNS"), _reward(obj, "LOG_RETURNS"))  # type: ignore[arg-type]


def _decode_end(obj: dict) -> EndEpisode:
    w = "END_EPISODE"
    return EndEpisode(_episode_id(obj, w), _observation(obj, w),  # type: ignore[arg-type]
                      terminated=_flag(obj, "terminated", w, default=not obj.get("truncated")),
                      truncated=_flag(obj, "truncated", w))


def _decode_step(obj: dict) -> Step:
    w = "STEP"
    return Step(_episode_id(obj, w), _reward(obj, w), _observation(obj, w),  # type: ignore[arg-type]
                terminated=_flag(obj, "terminated", w), truncated=_flag(obj, "truncated", w))


PLAIN_STEP = {"episode_id", "observation", "reward"}  # (the keys of the common entry)


def decode_entry(obj: Any, index: int) -> BatchEntry:
    """One STEP_BATCH entry; a start carries no reward, every other entry one. (The common
    entry -- a plain step with a float reward -- is checked field by field in a few lines, as
    the general path below would check it; anything else, valid or not, takes that path.)"""
    if type(obj) is dict and obj.keys() == PLAIN_STEP:
        eid, reward, obs = obj["episode_id"], obj["reward"], obj["observation"]
        if type(reward) is float and -F32_MAX <= reward <= F32_MAX and obs is not None and id_error(eid, "") is None:
            return BatchEntry(eid, obs, reward)
    return _decode_entry(obj, index)


def _decode_entry(obj: Any, index: int) -> BatchEntry:
    w = f"steps[{index}]"
    if not isinstance(obj, dict):
        raise BadMessage(f"{w} must be an object")
    start = _flag(obj, "start", w)
    reward = _reward(obj, w, required=not start)
    if start and reward is not None:
        raise BadMessage(f"{w}: a start entry carries no reward")
    return BatchEntry(episode_id=_episode_id(obj, w), observation=_observation(obj, w),  # type: ignore[arg-type]
                      reward=reward, terminated=_flag(obj, "terminated", w),
                      truncated=_flag(obj, "truncated", w), start=start,
                      training_enabled=_get(obj, "training_enabled", (bool,), required=False, where=w),
                      agent_id=_opt_id(obj, "agent_id", w), policy_id=_opt_id(obj, "policy_id", w))


def _decode_step_batch(obj: dict) -> StepBatch:
    raw = _get(obj, "steps", (list,), where="STEP_BATCH")
    if not 1 <= len(raw) <= MAX_BATCH_STEPS:
        raise BadMessage(f"STEP_BATCH: steps must hold 1 to {MAX_BATCH_STEPS} entries, got {len(raw)}")
    entries = tuple(decode_entry(e, i) for i, e in enumerate(raw))
    if len({e.episode_id for e in entries}) != len(entries):
        raise BadMessage("STEP_BATCH: an episode_id appears twice")
    return StepBatch(entries)


def _decode_eval_episode(obj: Any, index: int) -> EvalEpisode:
    w = f"episodes[{index}]"
    if not isinstance(obj, dict):
        raise BadMessage(f"{w} must be an object")
    length = _get(obj, "episode_length", (int,), where=w)
    if not 0 <= length < 2**31:
        raise BadMessage(f"{w}: episode_length must be 0..2**31-1")
    seq = _get(obj, "weights_seq_no", (int,), required=False, default=-1, where=w)
    if not -2**63 <= seq < 2**63:
        raise BadMessage(f"{w}: weights_seq_no does not fit 64 bits")
    return EvalEpisode(_finite(obj, "episode_return", w), length, seq,  # type: ignore[arg-type]
                       policy_id=_opt_id(obj, "policy_id", w), agent_id=_opt_id(obj, "agent_id", w))


def _decode_eval_results(obj: dict) -> EvalResults:
    raw = _get(obj, "episodes", (list,), where="EVAL_RESULTS")
    if len(raw) > MAX_EVAL_EPISODES:
        raise BadMessage(f"EVAL_RESULTS: at most {MAX_EVAL_EPISODES} episodes per message")
    return EvalResults(tuple(_decode_eval_episode(e, i) for i, e in enumerate(raw)))


def _decode_metrics(obj: dict) -> Metrics:
    raw = _get(obj, "metrics", (dict,), where="METRICS")
    if len(raw) > MAX_METRICS_PER_MESSAGE:
        raise BadMessage(f"METRICS: at most {MAX_METRICS_PER_MESSAGE} names per message")
    out = {}
    for name in raw:
        if metric_name_error(name):
            raise BadMessage(f"METRICS: {metric_name_error(name)}")
        out[name] = _finite(raw, name, "METRICS")
    return Metrics(out)


def metric_name_error(name: object) -> str | None:
    """Why ``name`` cannot be a client metric (1-64 of ``[A-Za-z0-9_./-]``), or None."""
    if not isinstance(name, str) or not 1 <= len(name) <= METRIC_NAME_CHARS or not all(
            c.isascii() and (c.isalnum() or c in "_./-") for c in name):
        return (f"metric name {_brief(name)} must be 1-{METRIC_NAME_CHARS} characters "
                "of A-Z a-z 0-9 _ . / -")
    return None


def _decode_serve_attach(obj: dict) -> ServeAttach:
    w = "SERVE_ATTACH"
    return ServeAttach(pid=_get(obj, "pid", (int,), where=w), lanes=_get(obj, "lanes", (int,), where=w),
                       policy=_get(obj, "policy", (str,), required=False, where=w),
                       token=_get(obj, "token", (str,), required=False, where=w))


DECODERS: dict[MessageType, Any] = {
    MessageType.START_EPISODE: _decode_start,
    MessageType.GET_ACTION: _decode_get_action,
    MessageType.LOG_RETURNS: _decode_log_returns,
    MessageType.END_EPISODE: _decode_end,
    MessageType.STEP: _decode_step,
    MessageType.STEP_BATCH: _decode_step_batch,
    MessageType.EVAL_RESULTS: _decode_eval_results,
    MessageType.METRICS: _decode_metrics,
    MessageType.SERVE_ATTACH: _decode_serve_attach,
    MessageType.SERVE_DIRECT: lambda _o: ServeDirect(),
    MessageType.SERVE_DIRECT_READY: lambda _o: ServeDirectReady(),
    MessageType.EPISODE_STARTED: lambda o: EpisodeStarted(
        _get(o, "episode_id", (str,)), _get(o, "policy_id", (str,), required=False)),
    MessageType.ACTION: lambda o: Action(_get(o, "episode_id", (str,)), o.get("action"),
                                         _get(o, "weights_seq_no", (int,), required=False, default=-1)),
    MessageType.ACTIONS: lambda o: Actions(_get(o, "actions", (list,)),
                                           _get(o, "weights_seq_nos", (list,))),
    MessageType.SERVE_ATTACHED: lambda o: ServeAttached(
        _get(o, "area_name", (str,)), _get(o, "lanes", (int,)), _get(o, "layout", (dict,)),
        _get(o, "policy", (str,)), _get(o, "observation_space", (dict,)),
        _get(o, "action_space", (dict,))),
}
