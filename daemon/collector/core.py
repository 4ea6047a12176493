"""The collector's protocol core: what each RLlink message does, without any I/O.

``CollectorCore.handle(session, msg)`` returns a ``Plan`` (records to ingest, a
reply to send now, whether to wait for weights); the asyncio shell in
``daemon.collector.server`` carries it out. On-policy bookkeeping (who waits for
which ingest id, when to force a smaller batch) lives in ``WaitBook``.
"""
from __future__ import annotations

import hmac
import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from rlinkd.client_lib.protocol import codec, serving
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.client_lib.protocol.codec import BadMessage, Message
from rlinkd.client_lib.protocol.records import concat_records, fragment_records
from rlinkd.daemon.collector.admission import Admission
from rlinkd.daemon.collector.evaluation import ClientMetrics, EvalBook
from rlinkd.daemon.collector.agents import AgentRules, AgentState
from rlinkd.daemon.collector.ingest import EpisodeStats, Limits, PolicyInfo, Spaces
from rlinkd.client_lib.protocol.masking import mask_spec
from rlinkd.daemon.config import Config
from rlinkd.daemon.errors import protocol_error_kinds
from rlinkd.daemon.policies import PolicyDef
from rlinkd.daemon.wiring import step_layout
from rlinkd.shm.records import StepLayout


class Unauthenticated(BadMessage):
    """A message arrived before a PING with the right token."""


class HandedOver(Exception):
    """Raised out of a connection's message loop once it was handed to the inference role
    (its first serving message): the collector forgets it without a word, closing only its
    own descriptor of the socket (a TLS connection: after its relay ended)."""


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
    last_sent_seqs: dict[str, int] = field(default_factory=dict)  # other policies' versions sent
    waiting: dict[str, int] = field(default_factory=dict)  # policy -> ingest id to be trained on
    waiting_since: float = 0.0
    env_steps: int = 0
    agents: dict[str, AgentState] = field(default_factory=dict)  # open episodes; "" = no agent_id
    ended: OrderedDict = field(default_factory=OrderedDict)  # (agent, episode_id) seen ending
    shm_policies: set[str] = field(default_factory=set)  # policies with an attached ring
    internal: bool = False  # the daemon's own inference role (PING with the internal token)
    flavour: str = "json"   # "msgpack": RLlib >= 2.49's clients (collector.rllib_msgpack)

    @property
    def is_waiting(self) -> bool:
        return bool(self.waiting)


def policy_info(d: PolicyDef) -> PolicyInfo:
    """What the collector checks a policy's episodes against (spaces, mask, record layout)."""
    spaces = Spaces(d.obs_space, d.act_space, d.spec.dist_size,
                    mask_spec(d.obs_space, d.act_space, d.mask_key),
                    d.spec.state_size, d.spec.max_seq_len if d.spec.state_size else 0)
    return PolicyInfo(spaces, step_layout(d), d.trainable, d.off_policy, d.spec.box_dist,
                      d.spec.state_contract())


def _box_dist_key(p: PolicyInfo) -> dict[str, Any]:
    """SET_CONFIG's additive ``box_dist`` and ``state`` keys: present only for SAC's squashed
    Gaussian and for a recurrent policy."""
    return ({} if p.box_dist == "gaussian" else {"box_dist": p.box_dist}) | (
        {} if p.state is None else {"state": p.state})


def single_policy(spaces: Spaces, layout: StepLayout) -> dict[str, PolicyInfo]:
    """The policies of a daemon with only the default one (tests, tools)."""
    return {DEFAULT_POLICY: PolicyInfo(spaces, layout)}


@dataclass
class Plan:
    """What the shell must do for one message, in this order."""

    records: dict[str, np.ndarray] | None = None  # by policy: ingest into its episode ring
    reply: bytes | None = None           # send now
    newest_state: bool = False           # send SET_STATE with the newest weights
    wait_for_training: bool = False      # send SET_STATE once trained on the records
    status: bool = False                 # send a STATUS_REPORT
    attach: int | None = None            # shm: create a ring of this many records (0: default)
    attach_policy: str = DEFAULT_POLICY  # shm: ... for this policy's agents
    held: dict[str, int] | None = None   # versions the client holds (SET_STATE omits their models)
    shm_sample: codec.SampleReady | None = None  # shm: drain the ring, then reply WEIGHTS_READY
    serve: Message | None = None         # server-side actions: handled by collector.serving


class WaitBook:
    """On-policy clients waiting for weights trained on their records, per policy.

    ``session.waiting[policy]`` is the last ingest id (in that policy's episode ring) the
    client's records got; weights of that policy published with ``cutoff_ingest_id >=`` it
    satisfy that part; the client is released once no part is left. ``should_flush(policy)``
    says when every on-policy sampler is waiting (on any policy) or one has waited too long
    and some wait on ``policy``: the shell then asks the connector for a batch of that
    policy from whatever has arrived — so a policy that gets little data holds up no one.
    """

    def __init__(self, max_wait_s: float, off_policy: frozenset[str] = frozenset()) -> None:
        self.max_wait_s = max_wait_s
        self.off_policy = off_policy  # policies whose clients never wait (DQN, APPO)
        self.last_flush_cutoff: dict[str, int] = {}
        self.trained: dict[str, int] = {}  # per policy: the highest cutoff published so far

    def start_wait(self, session: Session, cutoffs: dict[str, int], now: float) -> bool:
        """Wait for the parts not trained yet (a batch may have trained a client's records
        before it asked: no later publish would release it). False: nothing to wait for."""
        session.waiting = {p: c for p, c in cutoffs.items()
                           if c > self.trained.get(p, -1) and p not in self.off_policy}
        session.waiting_since = now
        return bool(session.waiting)

    def released(self, sessions: list[Session], policy: str, cutoff: int) -> list[Session]:
        """Sessions whose last wait ``policy``'s weights up to ``cutoff`` satisfied."""
        self.trained[policy] = max(self.trained.get(policy, -1), cutoff)
        done = []
        for s in sessions:
            if s.waiting.get(policy, cutoff + 1) <= cutoff:
                del s.waiting[policy]
                if not s.waiting:
                    done.append(s)
        return done

    def should_flush(self, samplers: list[Session], policy: str, last_ingest_id: int,
                     now: float) -> bool:
        waiting = [s for s in samplers if s.waiting]
        if not any(policy in s.waiting for s in waiting):
            return False
        if last_ingest_id <= self.last_flush_cutoff.get(policy, -1):
            return False
        all_waiting = len(waiting) == len(samplers)
        overdue = any(now - s.waiting_since > self.max_wait_s for s in waiting)
        return all_waiting or overdue


class CollectorCore:
    """Protocol semantics and counters. Called only from the collector's event loop."""

    def __init__(self, cfg: Config, policies: dict[str, PolicyInfo],
                 counters: dict | None = None, internal_token: str = "") -> None:
        self.cfg = cfg
        self.internal_token = internal_token
        self.policies = policies
        self.mapping = cfg.policy_mapping
        self.max_agents = cfg.server.max_agents_per_connection
        self.agents = AgentRules(policies, cfg.policy_mapping, self.max_agents,
                                 Limits(cfg.server.max_episode_steps, cfg.server.max_obs_floats))
        self.policy_stats = {name: EpisodeStats() for name in policies}
        self.policy_steps = dict.fromkeys(policies, 0)
        self.sessions: dict[int, Session] = {}
        self.admission = Admission(cfg.server.max_connections, cfg.server.max_pending_connections)
        self.waits = WaitBook(cfg.sampling.max_wait_for_batch_s,
                              frozenset(n for n, p in policies.items() if p.off_policy))
        self.stats = EpisodeStats()
        self._ids = itertools.count(1)
        counters = counters or {}
        self.env_steps = int(counters.get("env_steps", 0))
        self.stats.episodes = int(counters.get("episodes", 0))
        self.protocol_errors = 0
        self.protocol_errors_by_kind = dict.fromkeys(protocol_error_kinds(), 0)
        self.evaluation = EvalBook(list(policies))
        self.client_metrics = ClientMetrics()
        self.messages = 0

    # ------------------------------------------------------------ sessions
    def open_session(self, peer: str, transport: str) -> Session:
        sid = next(self._ids)
        session = Session(id=sid, stream_id=sid, peer=peer, transport=transport,
                          authenticated=not self.cfg.server.token)
        self.sessions[sid] = session
        return session

    def new_stream_id(self) -> int:
        """A stream id no session or agent has (shared-memory agent slots get one each)."""
        return next(self._ids)

    def open_agents(self) -> int:
        """Agents with an episode in progress on a TCP connection (shm slots not counted)."""
        return sum(len(s.agents) for s in self.sessions.values())

    def close_session(self, session: Session) -> None:
        self.sessions.pop(session.id, None)
        self.client_metrics.forget(session.id)

    def samplers(self) -> list[Session]:
        return [s for s in self.sessions.values() if s.is_sampler]

    def on_policy_samplers(self) -> list[Session]:
        """Clients that wait for weights after each sample (the flush rule counts these). The
        inference role counts only while it waits: between samples it may have no episodes
        open at all, and must not hold up the flush of clients that do wait."""
        return [s for s in self.sessions.values() if s.waits_for_state and (s.is_waiting or not s.internal)]

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
        if not (hmac.compare_digest(token.encode(), self.cfg.server.token.encode())
                or self._is_internal(token)):
            raise Unauthenticated("wrong token")
        session.authenticated = True
        return self.handle(session, msg)

    def _is_internal(self, token: str | None) -> bool:
        return bool(self.internal_token and token) and hmac.compare_digest(
            str(token).encode(), self.internal_token.encode())

    def _ping(self, session: Session, msg: codec.Ping) -> Plan:
        if session.transport == "unix" and self._is_internal(msg.token):
            session.internal = True
            self.admission.exempt_from_limits(session.id)
        return Plan(reply=codec.encode(codec.Pong()))

    def _serve(self, session: Session, msg: Message) -> Plan:
        return Plan(serve=msg)

    def _eval_results(self, session: Session, msg: serving.EvalResults) -> Plan:
        """Evaluation episodes: counted under ``eval``, never in env_steps/episodes."""
        self.evaluation.record(msg.episodes, self.mapping.policy_for)
        return Plan()

    def _metrics(self, session: Session, msg: serving.Metrics) -> Plan:
        self.client_metrics.record(session.id, msg.metrics)
        return Plan()

    def _get_config(self, session: Session, msg: codec.GetConfig) -> Plan:
        s, default = self.cfg.sampling, self.policies[DEFAULT_POLICY].spaces
        policies = {name: {"observation_space": p.spaces.obs.to_json(),
                           "action_space": p.spaces.act.to_json(), "trainable": p.trainable,
                           **_box_dist_key(p)}
                    for name, p in self.policies.items()}
        reply = codec.SetConfig(env_steps_per_sample=s.env_steps_per_sample,
                                force_on_policy=s.force_on_policy and not self.policies[
                                    DEFAULT_POLICY].off_policy,
                                observation_space=default.obs.to_json(),
                                action_space=default.act.to_json(),
                                protocol_version=codec.PROTOCOL_VERSION, compact_arrays=True,
                                policies=policies, policy_mapping=self.mapping.to_json(),
                                max_agents_per_connection=self.max_agents,
                                **_box_dist_key(self.policies[DEFAULT_POLICY]))
        return Plan(reply=codec.encode(reply))

    def _get_state(self, session: Session, msg: codec.GetState) -> Plan:
        return Plan(newest_state=True, held=msg.weights_seq_nos)

    def _status(self, session: Session, msg: codec.Status) -> Plan:
        return Plan(status=True)

    def _episodes(self, session: Session, msg: codec.Episodes) -> Plan:
        records = self.ingest(session, msg)
        wants_state = isinstance(msg, codec.EpisodesAndGetState)
        # no records to train on (``episodes: []``, or only frozen policies'): the newest qualify
        on_policy = wants_state and self.cfg.sampling.force_on_policy and bool(records)
        session.waits_for_state = session.waits_for_state or on_policy
        return Plan(records=records, newest_state=wants_state and not on_policy,
                    wait_for_training=on_policy, held=msg.weights_seq_nos)

    def _attach(self, session: Session, msg: codec.Attach) -> Plan:
        if session.transport != "unix":
            raise BadMessage("ATTACH is only accepted on the daemon's Unix socket")
        policy = msg.policy or DEFAULT_POLICY
        if policy not in self.policies:
            raise BadMessage(f"ATTACH: unknown policy {policy!r} (known: {', '.join(self.policies)})")
        if policy in session.shm_policies:
            raise BadMessage(f"this connection is already attached for policy {policy!r}")
        session.is_shm = True
        session.shm_policies.add(policy)
        return Plan(attach=msg.capacity_records or 0, attach_policy=policy)

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
        codec.Attach: _attach, codec.SampleReady: _sample_ready,
        **dict.fromkeys((serving.StartEpisode, serving.GetAction, serving.LogReturns, serving.EndEpisode,
                         serving.Step, serving.StepBatch, serving.ServeAttach, serving.ServeDirect),
                        _serve),
        serving.EvalResults: _eval_results, serving.Metrics: _metrics}

    # ------------------------------------------------------------ ingestion
    def ingest(self, session: Session, msg: codec.Episodes) -> dict[str, np.ndarray]:
        """Validate every fragment first (all or nothing), then count; the step records of
        each trainable policy's fragments, by policy (frozen policies' are only counted)."""
        checked = self.agents.check_all(session.agents, session.ended, msg.episodes)
        parts: dict[str, list[np.ndarray]] = {}
        for c in checked:
            for ret, length in self.agents.account(session.agents, session.ended, c):
                self.stats.record(ret, length)
                self.policy_stats[c.policy].record(ret, length)
            self._count_steps(session, c.policy, c.frag.num_steps)
            info = self.policies[c.policy]
            if info.trainable:
                seq = self._behaviour_seq(session, msg, c.policy)
                parts.setdefault(c.policy, []).append(
                    fragment_records(c.frag, info.layout, session.stream_id, seq,
                                     info.spaces.max_seq_len))
        session.is_sampler = True
        return {p: concat_records(v, self.policies[p].layout.dtype) for p, v in parts.items()}

    def _count_steps(self, session: Session, policy: str, steps: int) -> None:
        session.env_steps += steps
        self.env_steps += steps
        self.policy_steps[policy] += steps

    @staticmethod
    def _behaviour_seq(session: Session, msg: codec.Episodes, policy: str) -> int:
        """The version that acted: the client's word for it, else the last one sent."""
        said = (msg.weights_seq_nos or {}).get(policy)
        if said is None and policy == DEFAULT_POLICY:
            said = msg.weights_seq_no
        if said is not None:
            return said
        return session.last_sent_seq if policy == DEFAULT_POLICY else session.last_sent_seqs.get(policy, -1)

    def count_shm(self, session: Session, policy: str, steps: int,
                  episodes: list[tuple[float, int]]) -> None:
        """Account records a shared-memory client wrote (steps and finished episodes)."""
        session.env_steps += steps
        self.env_steps += steps
        self.policy_steps[policy] += steps
        for ret, length in episodes:
            self.stats.record(ret, length)
            self.policy_stats[policy].record(ret, length)

    def counters(self) -> dict:
        """Counters a checkpoint keeps so a restarted daemon continues them."""
        return {"env_steps": self.env_steps, "episodes": self.stats.episodes}
