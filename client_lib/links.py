"""Links: how an Agent reaches the daemon. One reconnect loop, two transports.

``TcpLink`` speaks RLlink over TCP or a Unix socket; ``client_lib.shm_client.ShmLink``
writes into a shared-memory ring. Both offer ``open()``, ``submit()``, ``send_only()``,
``close()``, ``describe()`` and ``session_key()``, and share ``ReconnectingLink``'s
retry-with-backoff, so an Agent does not care which one it holds.
"""
from __future__ import annotations

import abc
import time
from dataclasses import dataclass

from rlinkd.client_lib.policy import OnnxPolicy
from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.codec import EpisodeFragment
from rlinkd.client_lib.protocol.fragments import Fragment
from rlinkd.client_lib.protocol.spaces import Space, space_from_json
from rlinkd.client_lib.transport import Address, RLlinkClient, ServerError


@dataclass
class LinkConfig:
    """What the server told us in SET_CONFIG (spaces only when it is rlinkd)."""

    env_steps_per_sample: int
    force_on_policy: bool
    observation_space: Space | None
    action_space: Space | None
    compact_arrays: bool = False  # the server reads compact arrays and columnar Dicts


def server_config(cfg: codec.SetConfig) -> LinkConfig:
    """A SET_CONFIG as a LinkConfig (SpaceError if the server's spaces are malformed)."""
    return LinkConfig(
        cfg.env_steps_per_sample, cfg.force_on_policy,
        space_from_json(cfg.observation_space) if cfg.observation_space else None,
        space_from_json(cfg.action_space) if cfg.action_space else None,
        bool(cfg.compact_arrays))


class ReconnectingLink(abc.ABC):
    """Reconnect-and-retry shared by the TCP and shared-memory links.

    ``_with_retry(action)`` (re)connects when needed and runs ``action``; on a lost
    connection (or an ERROR in ``RETRYABLE_ERRORS``: shutting down, evicted) it closes, waits with
    exponential backoff (50 ms doubling to 2 s) and tries again until
    ``reconnect_timeout_s``, then raises ConnectionError. Any other ERROR is raised at once.
    Subclasses provide ``client``, ``_connect()``, ``close()`` and ``describe()``.
    """

    reconnect_timeout_s: float
    reconnects: int
    client: RLlinkClient | None

    @abc.abstractmethod
    def describe(self) -> str:
        """Where this link goes, for messages (each transport says it its own way)."""

    @abc.abstractmethod
    def _connect(self) -> None:
        """Connect and handshake; sets ``client`` (raises ConnectionError/OSError on failure)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Drop the connection (idempotent); the next ``_with_retry`` reconnects."""

    def _client(self) -> RLlinkClient:
        """The connected client; ConnectionError (so ``_with_retry`` reconnects) when there is none."""
        if self.client is None:
            raise ConnectionError(f"{self.describe()}: not connected")
        return self.client

    def _with_retry(self, action):
        deadline, backoff = time.monotonic() + self.reconnect_timeout_s, 0.05
        while True:
            try:
                if self.client is None:
                    self._connect()
                return action()
            except (ConnectionError, OSError, ServerError) as exc:
                if isinstance(exc, ServerError) and not exc.retry:
                    raise
                self.close()
                if time.monotonic() + backoff > deadline:
                    raise ConnectionError(f"{self.describe()}: gave up reconnecting: {exc}") from exc
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                self.reconnects += 1


class TcpLink(ReconnectingLink):
    """RLlink over TCP or a Unix socket, with reconnect-and-resend."""

    def __init__(self, address: Address, token: str | None = None, ssl_context=None,
                 reconnect_timeout_s: float = 120.0, timeout_s: float | None = 300.0) -> None:
        self.address, self.token, self.ssl_context = address, token, ssl_context
        self.reconnect_timeout_s, self.timeout_s = reconnect_timeout_s, timeout_s
        self.client: RLlinkClient | None = None
        self.reconnects = 0
        self.spaces: tuple[Space, Space] | None = None

    def use_spaces(self, obs_space: Space, act_space: Space) -> None:
        """The spaces fragments are sent in (the Agent calls this once after ``open``)."""
        self.spaces = (obs_space, act_space)

    def _wire(self, fragments: list[Fragment]) -> list[EpisodeFragment]:
        if self.spaces is None:
            raise RuntimeError("use_spaces() must be called before sending fragments")
        compact = self.config.compact_arrays
        return [f.to_wire(*self.spaces, compact=compact) for f in fragments]

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
