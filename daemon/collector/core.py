"""The collector's protocol core: what each RLlink message does, without any I/O.

``CollectorCore.handle(session, msg)`` returns a ``Plan`` (records to ingest, a
reply to send now, whether to wait for weights); the asyncio shell in
``daemon.collector.server`` carries it out. On-policy bookkeeping (who waits for
which ingest id, when to force a smaller batch) lives in ``WaitBook``.
"""
from __future__ import annotations

import hmac
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.codec import BadMessage, Message
from rlinkd.client_lib.protocol.records import concat_records, fragment_records
from rlinkd.daemon.collector.admission import Admission
from rlinkd.daemon.collector.ingest import (EpisodeStats, EpisodeTracker, Limits, Spaces,
                                           validate_fragment)
from rlinkd.daemon.config import Config
from rlinkd.shm.records import StepLayout


class Unauthenticated(BadMessage):
    """A message arrived before a PING with the right token."""


def error_kind(exc: Exception) -> str:
    """The label a protocol error is counted under: its class name in snake case
    (``FrameTooLarge`` → ``frame_too_large``). The protocol-error classes are a small fixed
    hierarchy (codec, ingest, this module), so the set of kinds is too."""
    return _snake(type(exc).__name__)


def protocol_error_kinds() -> list[str]:
    """Every kind ``error_kind`` can give: ``ProtocolError`` and its subclasses, as loaded
    (status lists each with its count, zero included, so a series exists before the first)."""
    kinds, todo = set(), [codec.ProtocolError]
    while todo:
        cls = todo.pop()
        kinds.add(_snake(cls.__name__))
        todo += cls.__subclasses__()
    return sorted(kinds)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@dataclass
class Session:
    """One client connection's state (TCP or Unix socket)."""

    id: int
    stream_id: int
    peer: str
    transport: str
    authenticated: bool
    is_sampler: bool = False
    is_shm: bool = False
    waits_for_state: bool = False  # has sent EPISODES_AND_GET_STATE: an on-policy sampler
    last_sent_seq: int = -1
    waiting_cutoff: int | None = None
    waiting_since: float = 0.0
    env_steps: int = 0
    tracker: EpisodeTracker = field(default_factory=EpisodeTracker)


@dataclass
class Plan:
    """What the shell must do for one message, in this order."""

    records: np.ndarray | None = None    # ingest into the episode ring
    reply: bytes | None = None           # send now
    newest_state: bool = False           # send SET_STATE with the newest weights
    wait_for_training: bool = False      # send SET_STATE once trained on the records
    status: bool = False                 # send a STATUS_REPORT
    attach: int | None = None            # shm: create a ring of this many records (0: default)
    shm_sample: codec.SampleReady | None = None  # shm: drain the ring, then reply WEIGHTS_READY


class WaitBook:
    """On-policy clients waiting for weights trained on their records.

    ``cutoff`` is the last ingest id a client's records got; weights published with
    ``cutoff_ingest_id >= cutoff`` satisfy it. ``should_flush`` says when every
    on-policy sampler is waiting (or one has waited too long): the shell then asks
    the connector to build a batch from whatever has arrived.
    """

    def __init__(self, max_wait_s: float) -> None:
        self.max_wait_s = max_wait_s
        self.last_flush_cutoff = -1

    def start_wait(self, session: Session, cutoff: int, now: float) -> None:
        session.waiting_cutoff, session.waiting_since = cutoff, now

    def released(self, sessions: list[Session], cutoff: int) -> list[Session]:
        done = [s for s in sessions if s.waiting_cutoff is not None and s.waiting_cutoff <= cutoff]
        for s in done:
            s.waiting_cutoff = None
        return done

    def should_flush(self, samplers: list[Session], last_ingest_id: int, now: float) -> bool:
        waiting = [s for s in samplers if s.waiting_cutoff is not None]
        if not waiting or last_ingest_id <= self.last_flush_cutoff:
            return False
        all_waiting = len(waiting) == len(samplers)
        overdue = any(now - s.waiting_since > self.max_wait_s for s in waiting)
        return all_waiting or overdue


class CollectorCore:
    """Protocol semantics and counters. Called only from the collector's event loop."""

    def __init__(self, cfg: Config, spaces: Spaces, layout: StepLayout,
                 counters: dict | None = None) -> None:
        self.cfg = cfg
        self.spaces, self.layout = spaces, layout
        self.limits = Limits(cfg.server.max_episode_steps, cfg.server.max_obs_floats)
        self.sessions: dict[int, Session] = {}
        self.admission = Admission(cfg.server.max_connections, cfg.server.max_pending_connections)
        self.waits = WaitBook(cfg.sampling.max_wait_for_batch_s)
        self.stats = EpisodeStats()
        self._ids = itertools.count(1)
        counters = counters or {}
        self.env_steps = int(counters.get("env_steps", 0))
        self.stats.episodes = int(counters.get("episodes", 0))
        self.protocol_errors = 0
        self.protocol_errors_by_kind = dict.fromkeys(protocol_error_kinds(), 0)
        self.messages = 0

    # ------------------------------------------------------------ sessions
    def open_session(self, peer: str, transport: str) -> Session:
        sid = next(self._ids)
        session = Session(id=sid, stream_id=sid, peer=peer, transport=transport,
                          authenticated=not self.cfg.server.token)
        self.sessions[sid] = session
        return session

    def close_session(self, session: Session) -> None:
        self.sessions.pop(session.id, None)

    def samplers(self) -> list[Session]:
        return [s for s in self.sessions.values() if s.is_sampler]

    def on_policy_samplers(self) -> list[Session]:
        """Clients that wait for weights after each sample (the flush rule counts these)."""
        return [s for s in self.sessions.values() if s.waits_for_state]

    def count_protocol_error(self, kind: str) -> None:
        """Called by the shell once per connection closed for bad input (``error_kind``)."""
        self.protocol_errors += 1
        self.protocol_errors_by_kind[kind] = self.protocol_errors_by_kind.get(kind, 0) + 1

    # ------------------------------------------------------------ messages
    def handle(self, session: Session, msg: Message) -> Plan:
        """Decide what one decoded message does. Raises BadMessage for bad input."""
        self.messages += 1
        if not session.authenticated:
            return self._authenticate(session, msg)
        handler = self._HANDLERS.get(type(msg))
        if handler is None:
            raise BadMessage(f"{msg.TYPE.value} is not a request this server accepts")
        return handler(self, session, msg)

    def _authenticate(self, session: Session, msg: Message) -> Plan:
        token = getattr(msg, "token", None)
        if not isinstance(msg, (codec.Ping, codec.Status)) or token is None:
            raise Unauthenticated("authentication required: send PING with the token first")
        if not hmac.compare_digest(token.encode(), self.cfg.server.token.encode()):
            raise Unauthenticated("wrong token")
        session.authenticated = True
        return self.handle(session, msg)

    def _ping(self, session: Session, msg: codec.Ping) -> Plan:
        return Plan(reply=codec.encode(codec.Pong()))

    def _get_config(self, session: Session, msg: codec.GetConfig) -> Plan:
        s = self.cfg.sampling
        reply = codec.SetConfig(env_steps_per_sample=s.env_steps_per_sample,
                                force_on_policy=s.force_on_policy,
                                observation_space=self.spaces.obs.to_json(),
                                action_space=self.spaces.act.to_json(),
                                protocol_version=codec.PROTOCOL_VERSION, compact_arrays=True)
        return Plan(reply=codec.encode(reply))

    def _get_state(self, session: Session, msg: codec.GetState) -> Plan:
        return Plan(newest_state=True)

    def _status(self, session: Session, msg: codec.Status) -> Plan:
        return Plan(status=True)

    def _episodes(self, session: Session, msg: codec.Episodes) -> Plan:
        records = self.ingest(session, msg)
        wants_state = isinstance(msg, codec.EpisodesAndGetState)
        # no records (``episodes: []``): nothing to train on, the newest weights qualify
        on_policy = wants_state and self.cfg.sampling.force_on_policy and len(records) > 0
        session.waits_for_state = session.waits_for_state or on_policy
        return Plan(records=records, newest_state=wants_state and not on_policy,
                    wait_for_training=on_policy)

    def _attach(self, session: Session, msg: codec.Attach) -> Plan:
        if session.transport != "unix":
            raise BadMessage("ATTACH is only accepted on the daemon's Unix socket")
        if session.is_shm:
            raise BadMessage("this connection is already attached")
        session.is_shm = True
        return Plan(attach=msg.capacity_records or 0)

    def _sample_ready(self, session: Session, msg: codec.SampleReady) -> Plan:
        if not session.is_shm:
            raise BadMessage("SAMPLE_READY needs an attached shared-memory ring (ATTACH)")
        session.is_sampler = True
        on_policy = msg.get_state and self.cfg.sampling.force_on_policy
        session.waits_for_state = session.waits_for_state or on_policy
        return Plan(shm_sample=msg)

    _HANDLERS: ClassVar[dict[type, Callable[[CollectorCore, Session, Any], Plan]]] = {
        codec.Ping: _ping, codec.GetConfig: _get_config, codec.GetState: _get_state,
        codec.Status: _status, codec.Episodes: _episodes, codec.EpisodesAndGetState: _episodes,
        codec.Attach: _attach, codec.SampleReady: _sample_ready}

    # ------------------------------------------------------------ ingestion
    def ingest(self, session: Session, msg: codec.Episodes) -> np.ndarray:
        """Validate every fragment first (all or nothing), then convert and count."""
        frags = [validate_fragment(f, self.spaces, self.limits, f"episodes[{i}]")
                 for i, f in enumerate(msg.episodes)]
        seq = msg.weights_seq_no if msg.weights_seq_no is not None else session.last_sent_seq
        parts = [fragment_records(f, self.layout, session.stream_id, seq) for f in frags]
        session.is_sampler = True
        for frag in frags:
            for ret, length in session.tracker.add(frag):
                self.stats.record(ret, length)
        steps = sum(f.num_steps for f in frags)
        session.env_steps += steps
        self.env_steps += steps
        return concat_records(parts, self.layout.dtype)

    def count_shm(self, session: Session, steps: int, episodes: list[tuple[float, int]]) -> None:
        """Account records a shared-memory client wrote (steps and finished episodes)."""
        session.env_steps += steps
        self.env_steps += steps
        for ret, length in episodes:
            self.stats.record(ret, length)

    def counters(self) -> dict:
        """Counters a checkpoint keeps so a restarted daemon continues them."""
        return {"env_steps": self.env_steps, "episodes": self.stats.episodes}
