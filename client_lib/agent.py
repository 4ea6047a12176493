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

from dataclasses import dataclass, field

import numpy as np

from rlinkd.client_lib.reporting import EvalTally, MetricBuffer
from rlinkd.client_lib.links import TcpLink
from rlinkd.client_lib.policy import ActionChooser, forward, state_size
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.client_lib.protocol.columns import Columns, obs_columns
from rlinkd.client_lib.protocol.fragments import Fragment
from rlinkd.client_lib.protocol.spaces import Space, space_from_gym
from rlinkd.client_lib.protocol.addresses import is_local
from rlinkd.client_lib.shm_client import ShmLink, open_local_link
from rlinkd.client_lib.transport import parse_address


@dataclass
class FragmentBuffer:
    """Steps of the episode in progress since the last send: observation columns of one
    row each, float32 action vectors, rewards, log-probs and dist inputs; for a recurrent
    policy (``max_seq_len`` L > 0) also the state the actor fed before each step."""

    obs: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    rewards: list = field(default_factory=list)
    logp: list = field(default_factory=list)
    dist: list = field(default_factory=list)
    states: list = field(default_factory=list)
    max_seq_len: int = 0

    def record(self, pending: tuple, reward: float, next_obs: Columns) -> None:
        """One step: the (action, logp, dist, state before the step or None) chosen by
        ``act``, its reward and the observation after it (columns of one row)."""
        action, logp, dist, state = pending
        self.actions.append(action)
        self.logp.append(logp)
        self.dist.append(dist)
        if state is not None:
            self.states.append(state)
        self.rewards.append(float(reward))
        self.obs.append(next_obs)

    def restart(self) -> FragmentBuffer:
        """The buffer that continues this episode after a cut (from its last observation)."""
        return FragmentBuffer(obs=[self.obs[-1]], max_seq_len=self.max_seq_len)

    def state_in(self) -> np.ndarray | None:
        """The fragment's state rows: the states before its steps 0, L, 2L, ... [K, S]."""
        if not self.max_seq_len:
            return None
        return np.stack(self.states[::self.max_seq_len]).astype(np.float32)

    def to_fragment(self, terminated: bool, truncated: bool, agent_id: str | None = None,
                    episode_id: str | None = None, policy_id: str | None = None) -> Fragment:
        obs = {key: np.concatenate([o[key] for o in self.obs]) for key in self.obs[0]}
        return Fragment(
            obs=obs, actions=np.stack(self.actions).astype(np.float32),
            rewards=np.asarray(self.rewards, np.float64), is_terminated=terminated,
            is_truncated=truncated, action_logp=np.asarray(self.logp, np.float32),
            action_dist_inputs=np.stack(self.dist).astype(np.float32),
            agent_id=agent_id, episode_id=episode_id, policy_id=policy_id,
            state_in=self.state_in())


class EpisodeMemory:
    """The state of one agent's recurrent policy between steps ([1, S]; None when the
    policy is feed-forward): zeros when an episode starts, then each step's state_out."""

    def __init__(self, state_size: int) -> None:
        self.state_size = state_size
        self.state: np.ndarray | None = None
        self.reset()

    def reset(self) -> None:
        self.state = np.zeros((1, self.state_size), np.float32) if self.state_size else None


class Agent:
    """One simulated agent talking to rlinkd (or any RLlink server)."""

    def __init__(self, link, observation_space: Space | None = None,
                 action_space: Space | None = None, explore: bool = True,
                 seed: int | None = None, mode: str = "train") -> None:
        if mode not in ("train", "evaluate"):
            raise ValueError(f"mode must be 'train' or 'evaluate', not {mode!r}")
        if mode == "train" and not explore:
            raise ValueError("a training agent explores (greedy steps would train PPO on a "
                             "deterministic policy): use mode='evaluate' for greedy play")
        self.link = link
        self.evaluate = mode == "evaluate"
        self.tally = EvalTally(link.send_message)
        self.metrics = MetricBuffer(link.send_message)
        cfg, self.policy = link.open()
        obs_space = cfg.observation_space or observation_space
        act_space = cfg.action_space or action_space
        if obs_space is None or act_space is None:
            raise ValueError("the server did not declare its spaces: pass observation_space "
                             "and action_space")
        self.obs_space: Space = obs_space
        self.act_space: Space = act_space
        link.use_spaces(obs_space, act_space)
        self.env_steps_per_sample = cfg.env_steps_per_sample
        self.force_on_policy = cfg.force_on_policy
        self.explore = explore
        default = cfg.policies.get(DEFAULT_POLICY)
        self.chooser = ActionChooser(self.act_space, seed,
                                     box_dist=default.box_dist if default else "gaussian")
        self.max_seq_len = default.max_seq_len if default else 0
        self.memory = EpisodeMemory(state_size(self.policy))
        self.buffer = FragmentBuffer(max_seq_len=self.max_seq_len)
        self.done_fragments: list[Fragment] = []
        self.pending: tuple | None = None
        self.steps_since_send = 0
        self.steps_synced = 0  # steps in samples the server acknowledged (reply received)

    @property
    def weights_seq_no(self) -> int:
        return self.policy.weights_seq_no

    def act(self, obs, explore: bool | None = None):
        """Choose an action for ``obs`` (its native form: an array, a dict of arrays for a
        Dict space, a tuple for a Tuple space) with the local policy, no network round trip.
        Returns the action in its native form. ``spaces.InvalidValue`` if ``obs`` does not
        fit the observation space. ``explore=False``: the greedy action; a training agent does
        not train on that step (its episode's fragment is cut there)."""
        x = obs_columns([obs], self.obs_space, 1, "obs")
        state = self.memory.state
        dist, self.memory.state = forward(self.policy, x, state)
        if self.evaluate or explore is False:
            action, _ = self.chooser.choose(dist, False)
            self.pending = ()  # a greedy step: never training data
            return self.chooser.to_env(action)
        action, logp = self.chooser.choose(dist, True, getattr(self.policy, "epsilon", None))
        if not self.buffer.obs:
            self.buffer.obs.append(x)
        self.pending = (action, logp, dist[0], None if state is None else state[0])
        return self.chooser.to_env(action)

    def step(self, reward: float, next_obs, terminated: bool, truncated: bool) -> None:
        """Record the outcome of the last ``act``; may send a sample and update weights."""
        if self.pending is None:
            raise RuntimeError("step() must follow act()")
        pending, self.pending = self.pending, None
        if terminated or truncated:
            self.memory.reset()  # the next act starts an episode: zeros
        if self.evaluate:
            self._evaluation_step(reward, bool(terminated or truncated))
            return
        if not pending:
            self._greedy_step(next_obs, bool(terminated or truncated))
            return
        b = self.buffer
        b.record(pending, reward, obs_columns([next_obs], self.obs_space, 1, "next_obs"))
        self.steps_since_send += 1
        if terminated or truncated:
            self.done_fragments.append(b.to_fragment(bool(terminated), bool(truncated)))
            self.buffer = FragmentBuffer(max_seq_len=self.max_seq_len)
        if self.steps_since_send >= self.env_steps_per_sample:
            self.sync()

    def truncate(self) -> None:
        """End the episode in progress as truncated at its last recorded step (nothing when
        it has no steps here): the next ``act`` starts an episode, with zeros for a recurrent
        policy's state; an evaluation episode cut short is not reported. For a driver that
        resets its env mid-episode. ValueError if an action is pending (step it first)."""
        if self.pending is not None:
            raise ValueError("truncate(): an action is pending (step it first)")
        self.tally.abandon()
        if self.buffer.actions:
            self.done_fragments.append(self.buffer.to_fragment(False, True))
        self.buffer = FragmentBuffer(max_seq_len=self.max_seq_len)
        self.memory.reset()

    def _greedy_step(self, next_obs, ended: bool) -> None:
        """A training agent stepped with a greedy action: cut the fragment before it (its
        steps bootstrap from the greedy step's observation) and go on from ``next_obs``."""
        if self.buffer.actions:
            self.done_fragments.append(self.buffer.to_fragment(False, False))
        self.buffer = FragmentBuffer(max_seq_len=self.max_seq_len)
        if not ended:
            self.buffer.obs.append(obs_columns([next_obs], self.obs_space, 1, "next_obs"))

    def _evaluation_step(self, reward: float, ended: bool) -> None:
        """Evaluation: nothing trains; an ended episode's return is reported and the newest
        weights are fetched (only if newer)."""
        self.tally.step(reward, ended, self.policy.weights_seq_no)
        if ended:
            policy = self.link.refresh(self.policy.weights_seq_no)
            if policy is not None:
                self.policy = policy

    def log_metric(self, name: str, value: float) -> None:
        """A scalar for TensorBoard ``client/<name>`` (RELAAX's ``metrics.scalar``): sent as a
        mean at most twice a second; the daemon limits names and rate per client.
        ValueError for a name outside 1-64 of ``[A-Za-z0-9_./-]`` or a non-finite value."""
        self.metrics.add(name, value)

    def sync(self) -> None:
        """Send what was collected and install the weights that come back."""
        fragments = self._take_fragments()
        if not fragments:
            return
        policy = self.link.submit(fragments, self.policy.weights_seq_no)
        if policy is not None:
            self.policy = policy  # (the state carries over: new weights, same episode)
        self.steps_synced += sum(f.num_steps for f in fragments)
        self.steps_since_send = 0

    def _take_fragments(self) -> list[Fragment]:
        fragments, self.done_fragments = self.done_fragments, []
        if self.buffer.actions:  # cut mid-episode: continue it in the next message
            fragments.append(self.buffer.to_fragment(False, False))
            self.buffer = self.buffer.restart()
        return fragments

    def close(self) -> None:
        """Send any remaining steps (without waiting for weights), evaluation results and
        metrics, and disconnect."""
        try:
            self.tally.flush()
            self.metrics.flush()
            self.link.send_only(self._take_fragments(), self.policy.weights_seq_no)
        except (ConnectionError, OSError):
            pass
        self.link.close()


def connect(address: str = "tcp://127.0.0.1:5555", *, token: str | None = None,
            observation_space=None, action_space=None, explore: bool = True,
            seed: int | None = None, reconnect_timeout_s: float = 120.0,
            ssl_context=None, capacity_records: int | None = None,
            inference: str = "client", mode: str | None = None, policy: str | None = None):
    """An Agent connected to ``address`` (``tcp://H:P``, ``H:P``, ``unix:///path``,
    ``shm`` or ``auto``; see ``client_lib.shm_client`` for the last two).
    ``capacity_records`` sizes a shared-memory ring (ValueError for a TCP address).

    ``inference="server"``: the daemon chooses every action (``client_lib.served``; same
    ``act``/``step`` API, nothing runs here); ``"client"`` (default): the policy runs here.
    ``mode="evaluate"``: greedy actions, nothing sent trains, weights refreshed after each
    episode, returns reported (status ``eval``, TensorBoard ``eval/*``). ``explore=False``
    without a mode means ``mode="evaluate"``; ``mode="train"`` with ``explore=False`` is a
    ValueError (greedy steps must not train)."""
    if inference not in ("client", "server"):
        raise ValueError(f"inference must be 'client' or 'server', not {inference!r}")
    mode = mode or ("train" if explore else "evaluate")
    if mode not in ("train", "evaluate"):
        raise ValueError(f"mode must be 'train' or 'evaluate', not {mode!r}")
    if inference == "server":
        from rlinkd.client_lib.served import open_served
        return open_served(address, token=token, reconnect_timeout_s=reconnect_timeout_s,
                           ssl_context=ssl_context, evaluate=mode == "evaluate", policy=policy)
    if policy is not None:
        raise ValueError("policy= applies to inference='server' (client-side agents use the mapping)")
    obs = _as_spec(observation_space)
    act = _as_spec(action_space)
    link = open_link(address, token=token, reconnect_timeout_s=reconnect_timeout_s,
                     ssl_context=ssl_context, capacity_records=capacity_records)
    return Agent(link, obs, act, explore=explore or mode == "evaluate", seed=seed, mode=mode)


def open_link(address: str, *, token: str | None, reconnect_timeout_s: float, ssl_context,
              capacity_records: int | None) -> TcpLink | ShmLink:
    """The link an address names (see ``connect``); nothing is connected yet."""
    if is_local(address) or address.startswith("unix://"):
        return open_local_link(address, token=token, reconnect_timeout_s=reconnect_timeout_s,
                               capacity_records=capacity_records)
    if capacity_records is not None:
        raise ValueError(f"capacity_records applies to shared-memory links, not {address!r}")
    return TcpLink(parse_address(address), token=token, ssl_context=ssl_context,
                   reconnect_timeout_s=reconnect_timeout_s)


def _as_spec(space) -> Space | None:
    if space is None or isinstance(space, Space):
        return space
    return space_from_gym(space)
