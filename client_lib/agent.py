"""The agent API for simulators that own their loop (a game engine is not a gym env).

    agent = connect("tcp://127.0.0.1:5555")
    action = agent.act(obs)                      # local inference, sampled while training
    agent.step(reward, next_obs, terminated, truncated)
    ...
    agent.close()

The agent records every step; once ``env_steps_per_sample`` steps are collected it
sends them (EPISODES_AND_GET_STATE) and installs the weights that come back — when
the server forces on-policy sampling this waits for weights trained on those steps.
An episode cut by a send continues in the next message (its first observation
repeats the last one), exactly as RLlink specifies. When the daemon goes away the
link reconnects with backoff and re-sends the pending sample: the episode in
progress is not lost.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from client_lib import codec
from client_lib.codec import EpisodeFragment
from client_lib.policy import ActionChooser, OnnxPolicy, observation_features
from client_lib.spaces import SpaceSpec
from client_lib.transport import Address, RLlinkClient, ServerError, parse_address


@dataclass
class LinkConfig:
    """What the server told us in SET_CONFIG (spaces only when it is rlinkd)."""

    env_steps_per_sample: int
    force_on_policy: bool
    observation_space: SpaceSpec | None
    action_space: SpaceSpec | None


class ReconnectingLink:
    """Reconnect-and-retry shared by the TCP and shared-memory links.

    ``_with_retry(action)`` (re)connects when needed and runs ``action``; on a lost
    connection (or an ERROR saying the daemon is shutting down) it closes, waits with
    exponential backoff (50 ms doubling to 2 s) and tries again until
    ``reconnect_timeout_s``, then raises ConnectionError. Any other ERROR is raised at once.
    Subclasses provide ``client``, ``_connect()``, ``close()`` and ``describe()``.
    """

    reconnect_timeout_s: float
    reconnects: int

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

    def open(self) -> tuple[LinkConfig, OnnxPolicy]:
        """Connect (retrying while the daemon is down), handshake, fetch the first weights."""
        return self._with_retry(lambda: (self.config, self._policy(self.client.get_state())))

    def submit(self, fragments: list[EpisodeFragment], seq_no: int) -> OnnxPolicy | None:
        """Send a sample and return the weights that come back (re-sent after a reconnect)."""
        return self._with_retry(
            lambda: self._policy(self.client.episodes_and_get_state(fragments, seq_no)))

    def send_only(self, fragments: list[EpisodeFragment], seq_no: int) -> None:
        if self.client is not None and fragments:
            self.client.episodes(fragments, seq_no)

    def session_key(self) -> str:
        """How the daemon's status names this connection (its ``peer``)."""
        return str(self.client.sock.getsockname()) if self.client else ""

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
        self.config = LinkConfig(
            cfg.env_steps_per_sample, cfg.force_on_policy,
            SpaceSpec.from_json(cfg.observation_space) if cfg.observation_space else None,
            SpaceSpec.from_json(cfg.action_space) if cfg.action_space else None)
        self.client = client

    @staticmethod
    def _policy(msg: codec.SetState) -> OnnxPolicy:
        return OnnxPolicy(msg)


@dataclass
class FragmentBuffer:
    """Steps of the episode in progress since the last send."""

    obs: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    rewards: list = field(default_factory=list)
    logp: list = field(default_factory=list)
    dist: list = field(default_factory=list)

    def to_fragment(self, terminated: bool, truncated: bool) -> EpisodeFragment:
        return EpisodeFragment(
            obs=np.stack(self.obs), actions=np.stack(self.actions),
            rewards=np.asarray(self.rewards, np.float64), is_terminated=terminated,
            is_truncated=truncated, action_logp=np.asarray(self.logp, np.float32),
            action_dist_inputs=np.stack(self.dist).astype(np.float32))


class Agent:
    """One simulated agent talking to rlinkd (or any RLlink server)."""

    def __init__(self, link, observation_space: SpaceSpec | None = None,
                 action_space: SpaceSpec | None = None, explore: bool = True,
                 seed: int | None = None) -> None:
        self.link = link
        cfg, self.policy = link.open()
        self.obs_space = cfg.observation_space or observation_space
        self.act_space = cfg.action_space or action_space
        if self.obs_space is None or self.act_space is None:
            raise ValueError("the server did not declare its spaces: pass observation_space "
                             "and action_space")
        self.env_steps_per_sample = cfg.env_steps_per_sample
        self.force_on_policy = cfg.force_on_policy
        self.explore = explore
        self.chooser = ActionChooser(self.act_space, seed)
        self.buffer, self.done_fragments = FragmentBuffer(), []
        self.pending: tuple | None = None
        self.steps_since_send = 0
        self.total_steps = 0
        self.steps_synced = 0  # steps in samples the server acknowledged (reply received)

    @property
    def weights_seq_no(self) -> int:
        return self.policy.weights_seq_no

    def act(self, obs, explore: bool | None = None):
        """Choose an action for ``obs`` with the local policy (no network round trip)."""
        x = observation_features(obs, self.obs_space)
        dist = self.policy.dist_inputs(x)
        action, logp = self.chooser.choose(dist, self.explore if explore is None else explore)
        if not self.buffer.obs:
            self.buffer.obs.append(np.asarray(obs))
        self.pending = (action, logp, dist[0])
        return self.chooser.to_env(action)

    def step(self, reward: float, next_obs, terminated: bool, truncated: bool) -> None:
        """Record the outcome of the last ``act``; may send a sample and update weights."""
        if self.pending is None:
            raise RuntimeError("step() must follow act()")
        action, logp, dist = self.pending
        self.pending = None
        b = self.buffer
        b.actions.append(action)
        b.logp.append(logp)
        b.dist.append(dist)
        b.rewards.append(float(reward))
        b.obs.append(np.asarray(next_obs))
        self.steps_since_send += 1
        self.total_steps += 1
        if terminated or truncated:
            self.done_fragments.append(b.to_fragment(bool(terminated), bool(truncated)))
            self.buffer = FragmentBuffer()
        if self.steps_since_send >= self.env_steps_per_sample:
            self.sync()

    def sync(self) -> None:
        """Send what was collected and install the weights that come back."""
        fragments = self._take_fragments()
        if not fragments:
            return
        policy = self.link.submit(fragments, self.policy.weights_seq_no)
        if policy is not None:
            self.policy = policy
        self.steps_synced += sum(f.num_steps for f in fragments)
        self.steps_since_send = 0

    def _take_fragments(self) -> list[EpisodeFragment]:
        fragments, self.done_fragments = self.done_fragments, []
        if self.buffer.actions:  # cut mid-episode: continue it in the next message
            fragments.append(self.buffer.to_fragment(False, False))
            self.buffer = FragmentBuffer(obs=[self.buffer.obs[-1]])
        return fragments

    def close(self) -> None:
        """Send any remaining steps (without waiting for weights) and disconnect."""
        try:
            self.link.send_only(self._take_fragments(), self.policy.weights_seq_no)
        except (ConnectionError, OSError):
            pass
        self.link.close()


def connect(address: str = "tcp://127.0.0.1:5555", *, token: str | None = None,
            observation_space=None, action_space=None, explore: bool = True,
            seed: int | None = None, reconnect_timeout_s: float = 120.0,
            ssl_context=None, **kwargs) -> Agent:
    """An Agent connected to ``address`` (``tcp://H:P``, ``H:P``, ``unix:///path``,
    ``shm`` or ``auto``; see ``client_lib.shm_client`` for the last two)."""
    obs = _as_spec(observation_space)
    act = _as_spec(action_space)
    if address in ("shm", "auto") or address.startswith(("shm:", "auto:", "unix://")):
        from client_lib.shm_client import open_local_link
        link = open_local_link(address, token=token, reconnect_timeout_s=reconnect_timeout_s,
                               **kwargs)
    else:
        link = TcpLink(parse_address(address), token=token, ssl_context=ssl_context,
                       reconnect_timeout_s=reconnect_timeout_s)
    return Agent(link, obs, act, explore=explore, seed=seed)


def _as_spec(space) -> SpaceSpec | None:
    if space is None or isinstance(space, SpaceSpec):
        return space
    return SpaceSpec.from_gym(space)
