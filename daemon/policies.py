"""The set of policies a daemon serves: one definition per name, resolved once at start.

``policy_defs(cfg)`` turns ``[env]``/``[ppo]`` (the ``default`` policy) and every
``[policies.NAME]`` table into ``PolicyDef``s: spaces (explicit, from a gymnasium id, or
[env]'s), the network (``PolicySpec``), the hyperparameters, whether the policy trains,
and where a frozen one is loaded from. The wiring makes one pipeline per trainable policy
from them; the collector routes each agent to one of them through ``cfg.policy_mapping``.
Called by the supervisor (``build_topology``); raises ``ConfigError`` naming the key.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Space, SpaceError, space_from_gym
from rlinkd.daemon.config import (APPOConfig, Config, ConfigValue, DQNConfig, PolicyConfig, PPOConfig,
                                  SACConfig, batch_slot_rows)
from rlinkd.daemon.errors import ConfigError


@dataclass(frozen=True)
class PolicyDef:
    """Everything that defines one policy (picklable: it travels inside the Topology)."""

    name: str
    obs_space: Space
    act_space: Space
    spec: PolicySpec
    ppo: PPOConfig
    trainable: bool = True
    load_from: str = ""
    mask_key: str = ""
    algorithm: str = "ppo"
    dqn: DQNConfig = field(default_factory=DQNConfig)
    appo: APPOConfig = field(default_factory=APPOConfig)
    sac: SACConfig = field(default_factory=SACConfig)

    @property
    def off_policy(self) -> bool:
        """Trained while clients sample: they never wait for weights (DQN, SAC, APPO)."""
        return self.algorithm in OFF_POLICY

    @property
    def uses_replay(self) -> bool:
        """Trained from a shared-memory replay buffer instead of train batches (DQN, SAC)."""
        return self.algorithm in REPLAY_ALGORITHMS

    @property
    def replay_hp(self) -> DQNConfig | SACConfig:
        """The replay algorithm's section: the keys its buffer, connector, learner shell and
        pacing share (buffer_size_steps, n_step, gamma, learning_starts_steps, batch_size,
        updates_per_step, publish_interval_updates, max_lead_steps, lr).
        ValueError for a policy without a replay buffer."""
        if not self.uses_replay:
            raise ValueError(f"policy {self.name!r} ({self.algorithm}) has no replay buffer")
        return self.sac if self.algorithm == "sac" else self.dqn


OFF_POLICY = ("dqn", "sac", "appo")
REPLAY_ALGORITHMS = ("dqn", "sac")


RELOADED_SECTIONS = ("ppo", "dqn", "sac")  # the sections whose reloadable keys a SIGHUP applies


def reloaded_sections(cfg: Config, name: str, changes: Mapping[str, ConfigValue]
                      ) -> dict[str, dict[str, ConfigValue]]:
    """The reloaded keys that reach policy ``name``: {section: {key: value}}, as a restart
    would give them. For a section the policy's own table replaces
    (``[policies.NAME.<section>]``), that table's changed keys (``policies.NAME.ppo.lr``);
    for the others, the changed global ``ppo.*`` / ``dqn.*`` / ``sac.*`` keys.
    ``reloadable_changes`` reports a global change that a table without that key inherits
    under the table's name too, so it arrives here."""
    table = cfg.policies.get(name, PolicyConfig())
    parts: dict[str, dict[str, ConfigValue]] = {}
    for key, value in changes.items():
        *path, field_name = key.split(".")
        own = path[:2] == ["policies", name] and len(path) == 3
        section = path[2] if own else path[0]
        if section in RELOADED_SECTIONS and own == (getattr(table, section) is not None):
            parts.setdefault(section, {})[field_name] = value
    return parts


def policy_defs(cfg: Config) -> dict[str, PolicyDef]:
    """Every policy by name, ``default`` first (it always exists)."""
    env_spaces = resolve_spaces(cfg.env.id, cfg.env.observation_space, cfg.env.action_space,
                                "env")
    tables = {DEFAULT_POLICY: cfg.policies.get(DEFAULT_POLICY, PolicyConfig()), **cfg.policies}
    return {name: _define(cfg, name, table, env_spaces) for name, table in tables.items()}


def _define(cfg: Config, name: str, table: PolicyConfig,
            env_spaces: tuple[Space, Space]) -> PolicyDef:
    where = "env" if name == DEFAULT_POLICY and name not in cfg.policies else f"policies.{name}"
    if table.env_id or table.observation_space or table.action_space:
        obs, act = resolve_spaces(table.env_id or cfg.env.id, table.observation_space,
                                  table.action_space, where)
    else:
        obs, act = env_spaces
    mask_key = table.action_mask_key or (cfg.env.action_mask_key if obs == env_spaces[0] else "")
    ppo, dqn, sac = table.ppo or cfg.ppo, table.dqn or cfg.dqn, table.sac or cfg.sac
    algorithm = table.algorithm or cfg.learner.algorithm
    _check_recurrent(cfg, f"policies.{name}.ppo" if table.ppo else "ppo", ppo, algorithm)
    nets: dict[str, PPOConfig | DQNConfig | SACConfig] = {"dqn": dqn, "sac": sac}
    net = nets.get(algorithm, ppo)
    box_dist = "squashed_gaussian" if algorithm == "sac" else "gaussian"
    spec = make_policy_spec(ppo, obs, act, mask_key, where, (net.hidden_sizes, net.activation),
                            box_dist, section=algorithm if algorithm in ("dqn", "sac") else "ppo")
    kinds = {c.kind for c in spec.action_components}
    if (algorithm == "dqn" and len(spec.action_components) != 1) or kinds - ALLOWED_KINDS[algorithm]:
        raise ConfigError(f"{where}: {algorithm} needs {NEEDS[algorithm]}, not {act.to_json()}")
    return PolicyDef(name, obs, act, spec, ppo, table.trainable, table.load_from, mask_key,
                     algorithm, dqn, cfg.appo, sac)


def _check_recurrent(cfg: Config, section: str, ppo: PPOConfig, algorithm: str) -> None:
    """ConfigError for a recurrent policy that cannot train exactly: a replay algorithm, or a
    ``max_seq_len`` longer than the connector's grid cuts allow (half a batch slot: a longer
    one could leave a chunk with no stored state to start from)."""
    if ppo.recurrent == "none":
        return
    if algorithm in REPLAY_ALGORITHMS:
        raise ConfigError(f"{section}.recurrent = {ppo.recurrent!r}: {algorithm} policies are "
                          "feed-forward (recurrent policies learn with ppo or appo)")
    longest = batch_slot_rows(cfg.sampling) // 2
    if ppo.max_seq_len > longest:
        raise ConfigError(f"{section}.max_seq_len ({ppo.max_seq_len}) must not exceed {longest}, "
                          "half a train-batch slot (2 * sampling.train_batch_size + "
                          "sampling.env_steps_per_sample + 1024 rows): the connector cuts "
                          "long runs there on the state grid")


ALLOWED_KINDS = {"ppo": {"categorical", "bernoulli", "gaussian"}, "dqn": {"categorical"},
                 "sac": {"squashed_gaussian"}}
ALLOWED_KINDS["appo"] = ALLOWED_KINDS["ppo"]
NEEDS = {"dqn": "a single Discrete action", "sac": "float Box actions with finite bounds"}


def resolve_spaces(env_id: str, obs: Space | None, act: Space | None,
                   where: str) -> tuple[Space, Space]:
    """Spaces from explicit descriptions, else (for the missing one) from the gymnasium id.
    ConfigError naming ``where``.env_id/id when gymnasium cannot build that environment or
    its spaces are not supported: the CLI prints one line and exits 78."""
    if obs is not None and act is not None:
        return obs, act
    import gymnasium as gym
    key = f"{where}.id" if where == "env" else f"{where}.env_id"
    try:
        env = gym.make(env_id)
    except Exception as exc:  # the gymnasium boundary: any failure is a config error
        raise ConfigError(f"{key} = {env_id!r}: gymnasium cannot make this environment "
                          f"({type(exc).__name__}: {exc})") from exc
    try:
        return (obs or space_from_gym(env.observation_space),
                act or space_from_gym(env.action_space))
    except SpaceError as exc:
        raise ConfigError(f"{key} = {env_id!r}: {exc}") from exc
    finally:
        env.close()


def make_policy_spec(ppo: PPOConfig, obs: Space, act: Space, mask_key: str,
                     where: str = "env", net: tuple[tuple[int, ...], str] | None = None,
                     box_dist: str = "gaussian", section: str = "ppo") -> PolicySpec:
    """The network every process agrees on (flat weight layout, ONNX graph). ConfigError
    when the spaces and the network settings do not fit together (an action mask of the
    wrong size, a conv stack larger than the image, an integer Box action). ``net``:
    (hidden sizes, activation) of another algorithm's section (default: [ppo]'s); ``box_dist``:
    SAC's "squashed_gaussian" (ConfigError when a Box action has an infinite bound)."""
    hidden, activation = net or (ppo.hidden_sizes, ppo.activation)
    try:
        cell = ppo.recurrent if section == "ppo" else "none"  # (replay algorithms refuse one)
        return PolicySpec(obs, act, hidden_sizes=hidden, activation=activation,
                          log_std_init=ppo.log_std_init, cnn_channels=ppo.cnn_channels,
                          cnn_kernels=ppo.cnn_kernels, cnn_strides=ppo.cnn_strides,
                          cnn_dense=ppo.cnn_dense, action_mask_key=mask_key, box_dist=box_dist,
                          recurrent=cell, recurrent_size=ppo.recurrent_size,
                          max_seq_len=ppo.max_seq_len)
    except (SpaceError, ValueError) as exc:
        raise ConfigError(f"{where}/{section}: {exc}") from exc
