"""Links: how an Agent reaches the daemon. One reconnect loop, two transports.

``TcpLink`` speaks RLlink over TCP or a Unix socket; ``client_lib.shm_client.ShmLink``
writes into a shared-memory ring. Both offer ``open()``, ``submit()``, ``send_only()``,
``close()``, ``describe()`` and ``session_key()``, and share ``ReconnectingLink``'s
retry-with-backoff, so an Agent does not care which one it holds.

Many agents and policies (``client_lib.multi``) use the same links through three more
verbs: ``open_policies()`` (handshake, first weights), ``policy(name)`` (the current
weights of one policy; a shared-memory link attaches that policy's ring on first use) and
``exchange(sends, held, get_state)`` (send ``(slot, Fragment)`` pairs, return the policies
whose weights changed).
"""
from __future__ import annotations

import abc
import logging
import time
from dataclasses import dataclass, field

from rlinkd.client_lib.policy import OnnxPolicy
from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY, MappingError, PolicyMapping
from rlinkd.client_lib.protocol.codec import EpisodeFragment
from rlinkd.client_lib.protocol.distributions import BOX_DISTS
from rlinkd.client_lib.protocol.fragments import Fragment
from rlinkd.client_lib.protocol.spaces import Space, space_from_json
from rlinkd.client_lib.transport import Address, RLlinkClient, RLlinkError, ServerError

log = logging.getLogger("rlinkd.client_lib")

Sends = list[tuple[int, Fragment]]
"""What a many-agent client sends: (agent slot, fragment) pairs, each slot's fragments in
the order they happened (a slot's ended episode before the next one on that slot)."""


@dataclass(frozen=True)
class PolicyInfo:
    """One policy as SET_CONFIG declares it."""

    obs_space: Space
    act_space: Space
    trainable: bool = True
    box_dist: str = "gaussian"  # SAC policies: "squashed_gaussian"
    state: dict | None = None   # a recurrent policy: SET_CONFIG's "state" (``recurrent.state_contract``)

    @property
    def max_seq_len(self) -> int:
        """L, the grid of a recurrent policy's fragment state rows; 0 when feed-forward."""
        return int(self.state["max_seq_len"]) if self.state else 0


@dataclass
class LinkConfig:
    """What the server told us in SET_CONFIG (spaces only when it is rlinkd; ``policies``,
    ``mapping`` and ``max_agents_per_connection`` only when it supports many agents)."""

    env_steps_per_sample: int
    force_on_policy: bool
    observation_space: Space | None
    action_space: Space | None
    compact_arrays: bool = False  # the server reads compact arrays and columnar Dicts
    policies: dict[str, PolicyInfo] = field(default_factory=dict)
    mapping: PolicyMapping = field(default_factory=PolicyMapping)
    max_agents_per_connection: int | None = None


def server_config(cfg: codec.SetConfig) -> LinkConfig:
    """A SET_CONFIG as a LinkConfig (SpaceError if the server's spaces are malformed,
    RLlinkError if its policies or policy mapping are)."""
    obs = space_from_json(cfg.observation_space) if cfg.observation_space else None
    act = space_from_json(cfg.action_space) if cfg.action_space else None
    try:
        policies = _policies(cfg.policies or {})
        mapping = PolicyMapping.from_json(cfg.policy_mapping or [])
    except (MappingError, KeyError, TypeError) as exc:
        raise RLlinkError(f"malformed SET_CONFIG policies: {exc}") from None
    if obs is not None and act is not None:
        policies.setdefault(DEFAULT_POLICY, PolicyInfo(obs, act, True, _box_dist(cfg.box_dist),
                                                       _state(cfg.state)))
    return LinkConfig(cfg.env_steps_per_sample, cfg.force_on_policy, obs, act,
                      bool(cfg.compact_arrays), policies, mapping, cfg.max_agents_per_connection)


def _policies(raw: dict) -> dict[str, PolicyInfo]:
    return {name: PolicyInfo(space_from_json(p["observation_space"]),
                             space_from_json(p["action_space"]), bool(p.get("trainable", True)),
                             _box_dist(p.get("box_dist")), _state(p.get("state")))
            for name, p in raw.items()}


def _state(value: object) -> dict | None:
    """SET_CONFIG's ``state`` (absent: a feed-forward policy); RLlinkError when it has no
    positive integer ``max_seq_len``."""
    if value is None:
        return None
    seq = value.get("max_seq_len") if isinstance(value, dict) else None
    if not isinstance(value, dict) or not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise RLlinkError(f"SET_CONFIG: malformed state {str(value)[:200]}")
    return value


def _box_dist(value: object) -> str:
    """SET_CONFIG's ``box_dist`` (absent: "gaussian"); RLlinkError for an unknown one."""
    if value is None:
        return "gaussian"
    if value not in BOX_DISTS:
        raise RLlinkError(f"SET_CONFIG: unknown box_dist {value!r} (known: {BOX_DISTS})")
    return str(value)


def changed_policies(msg: codec.SetState, held: dict[str, int]) -> dict[str, codec.SetState]:
    """The SET_STATE's policies whose version differs from ``held`` ({policy: seq the client
    holds}), each as a one-policy SetState. The top level is the default policy; entries of
    ``policies`` without ``onnx_file`` are ones the client already holds. RLlinkError when an
    entry is malformed."""
    out = {}
    if msg.weights_seq_no != held.get(DEFAULT_POLICY):
        out[DEFAULT_POLICY] = msg
    for name, entry in (msg.policies or {}).items():
        if not isinstance(entry, dict) or not isinstance(entry.get("weights_seq_no"), int):
            raise RLlinkError(f"SET_STATE: malformed entry for policy {name!r}")
        if "onnx_file" in entry and entry["weights_seq_no"] != held.get(name):
            out[name] = codec.SetState(entry["weights_seq_no"], str(entry["onnx_file"]),
                                       entry.get("onnx_sha256"), exploration=msg.exploration)
    return out


class ReconnectingLink(abc.ABC):
    """Reconnect-and-retry shared by the TCP and shared-memory links.

    ``_with_retry(action)`` (re)connects when needed and runs ``action``; on a lost
    connection (or an ERROR in ``RETRYABLE_ERRORS``: shutting down, evicted) it closes, waits with
    exponential backoff (50 ms doubling to 2 s) and tries again until
    ``reconnect_timeout_s``, then raises ConnectionError. Any other ERROR is raised at once.
    The first failure of a wait is logged at once (a warning, on stderr when logging is not
    configured) saying what it waits for and for how long; a link that never connected says
    "could not connect", one that lost its connection "gave up reconnecting".
    Subclasses provide ``client``, ``_connect()``, ``close()`` and ``describe()``.
    """

    reconnect_timeout_s: float
    reconnects: int
    client: RLlinkClient | None
    connected_once: bool = False

    @abc.abstractmethod
    def describe(self) -> str:
        """Where this link goes, for messages (each transport says it its own way)."""

    @abc.abstractmethod
    def _connect(self) -> None:
        """Connect and handshake; sets ``client`` (raises ConnectionError/OSError on failure)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Drop the connection (idempotent); the next ``_with_retry`` reconnects."""

    def send_message(self, msg: codec.Message) -> None:
        """One message that expects no reply (EVAL_RESULTS, METRICS), reconnecting if needed."""
        self._with_retry(lambda: self._client().send(msg))

    def _client(self) -> RLlinkClient:
        """The connected client; ConnectionError (so ``_with_retry`` reconnects) when there is none."""
        if self.client is None:
            raise ConnectionError(f"{self.describe()}: not connected")
        return self.client

    def _with_retry(self, action):
        deadline, backoff, waiting = time.monotonic() + self.reconnect_timeout_s, 0.05, False
        while True:
            try:
                if self.client is None:
                    self._connect()
                    self.connected_once = True
                return action()
            except (ConnectionError, OSError, ServerError) as exc:
                if isinstance(exc, ServerError) and not exc.retry:
                    raise
                self.close()
                if time.monotonic() + backoff > deadline:
                    raise ConnectionError(self._gave_up(exc)) from exc
                if not waiting:
                    log.warning("%s", self._waiting(exc))
                    waiting = True
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                self.reconnects += 1

    def _waiting(self, exc: BaseException) -> str:
        """What a wait that begins says (once)."""
        what = "reconnecting" if self.connected_once else "cannot connect yet"
        return (f"{self.describe()}: {what} ({exc}); retrying for up to {self.reconnect_timeout_s:g} s"
                + ("" if self.connected_once else " (is the daemon running at this address?)"))

    def _gave_up(self, exc: BaseException) -> str:
        if not self.connected_once:
            return f"{self.describe()}: could not connect within {self.reconnect_timeout_s:g} s: {exc}"
        return f"{self.describe()}: gave up reconnecting after {self.reconnect_timeout_s:g} s: {exc}"


class TcpLink(ReconnectingLink):
    """RLlink over TCP or a Unix socket, with reconnect-and-resend."""

    def __init__(self, address: Address, token: str | None = None, ssl_context=None,
                 reconnect_timeout_s: float = 120.0, timeout_s: float | None = 300.0) -> None:
        self.address, self.token, self.ssl_context = address, token, ssl_context
        self.reconnect_timeout_s, self.timeout_s = reconnect_timeout_s, timeout_s
        self.client: RLlinkClient | None = None
        self.reconnects = 0
        self.spaces: tuple[Space, Space] | None = None
        self.latest: dict[str, codec.SetState] = {}  # newest weights per policy (many-agent use)

    def use_spaces(self, obs_space: Space, act_space: Space) -> None:
        """The spaces fragments are sent in (the Agent calls this once after ``open``)."""
        self.spaces = (obs_space, act_space)

    def _wire(self, fragments: list[Fragment]) -> list[EpisodeFragment]:
        """Fragments in their RLlink form, each in its policy's spaces."""
        compact = self.config.compact_arrays
        return [f.to_wire(*self._spaces_of(f), compact=compact) for f in fragments]

    def _spaces_of(self, frag: Fragment) -> tuple[Space, Space]:
        info = self.config.policies.get(frag.policy_id or "")
        if info is not None:
            return info.obs_space, info.act_space
        if self.spaces is None:
            raise RuntimeError("use_spaces() must be called before sending fragments")
        return self.spaces

    def open(self) -> tuple[LinkConfig, OnnxPolicy]:
        """Connect (retrying while the daemon is down), handshake, fetch the first weights."""
        return self._with_retry(lambda: (self.config, self._policy(self._client().get_state())))

    def submit(self, fragments: list[Fragment], seq_no: int) -> OnnxPolicy | None:
        """Send a sample and return the weights that come back (re-sent after a reconnect)."""
        return self._with_retry(lambda: self._policy(
            self._client().episodes_and_get_state(self._wire(fragments), seq_no)))

    def send_only(self, fragments: list[Fragment], seq_no: int) -> None:
        if self.client is not None and fragments:
            self.client.episodes(self._wire(fragments), seq_no)

    def refresh(self, seq_no: int) -> OnnxPolicy | None:
        """The newest weights if they are newer than ``seq_no`` (GET_STATE naming the version
        held: the daemon leaves the model out when it is the same), else None."""
        def fetch() -> OnnxPolicy | None:
            msg = self._client().request(codec.GetState(weights_seq_nos={DEFAULT_POLICY: seq_no}),
                                         codec.SetState)
            return OnnxPolicy(msg) if msg.weights_seq_no != seq_no and msg.onnx_file else None
        return self._with_retry(fetch)

    # ------------------------------------------------------------ many policies
    def open_policies(self) -> LinkConfig:
        """Connect (retrying while the daemon is down), handshake, fetch every policy's
        weights (one GET_STATE); then ``policy(name)`` gives them."""
        def fetch() -> LinkConfig:
            self.latest = changed_policies(self._client().get_state(), {})
            return self.config
        return self._with_retry(fetch)

    def policy(self, name: str) -> OnnxPolicy:
        """The newest weights received for policy ``name`` as a session (built on each call:
        callers keep it). ValueError if the server sent none."""
        try:
            return OnnxPolicy(self.latest[name], name)
        except KeyError:
            raise ValueError(f"{self.describe()}: the server sent no weights for policy "
                             f"{name!r}") from None

    def exchange(self, sends: Sends, held: dict[str, int], get_state: bool = True
                 ) -> dict[str, OnnxPolicy]:
        """Send the fragments (one EPISODES_AND_GET_STATE, re-sent after a reconnect) and
        return the held policies (``held``: {policy: seq} the caller acts with) whose
        weights changed. Versions of policies the caller does not use are kept here (and
        announced in ``weights_seq_nos``, so the server does not resend them unchanged).
        ``get_state`` False: one EPISODES if connected, no retry, nothing returned."""
        wire = self._wire([frag for _, frag in sends])
        seqs = {name: m.weights_seq_no for name, m in self.latest.items()} | held
        default_seq = seqs.get(DEFAULT_POLICY)
        if not get_state:
            if self.client is not None and wire:
                self.client.episodes(wire, default_seq, weights_seq_nos=seqs)
            return {}

        def send() -> dict[str, OnnxPolicy]:
            reply = self._client().episodes_and_get_state(wire, default_seq, weights_seq_nos=seqs)
            changed = changed_policies(reply, seqs)
            self.latest.update(changed)
            return {name: OnnxPolicy(m, name) for name, m in changed.items() if name in held}
        return self._with_retry(send)

    def session_key(self) -> str:
        """How the daemon's status names this connection (its ``peer``)."""
        sock = self.client.sock if self.client else None
        return str(sock.getsockname()) if sock else ""

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def describe(self) -> str:
        return str(self.address)

    def _connect(self) -> None:
        client = RLlinkClient(self.address, timeout_s=self.timeout_s, ssl_context=self.ssl_context)
        client.connect()
        client.ping(self.token)
        cfg = client.get_config()
        self.config = server_config(cfg)
        self.client = client

    @staticmethod
    def _policy(msg: codec.SetState) -> OnnxPolicy:
        return OnnxPolicy(msg)
