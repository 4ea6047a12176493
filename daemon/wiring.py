"""The daemon's topology, made in one place: every inbox and shared-memory segment.

Roles never create their own IPC; they receive a ``Topology`` (picklable into
``spawn``ed children: inbox fds are passed, segments are attached by path).

    clients ──TCP/Unix──▶ collector ──episode ring (shm)──▶ connector
                             ▲                                  │
                             │ WeightsPublished        batch slots (shm) + BatchReady
                             │                                  ▼
       weights board (shm) ◀─┴──────────────────────────── learner ──snapshot area (shm)──▶ checkpointer
                                                                                              │
    supervisor ◀── Listening / CollectorStatus / LearnerReady / CheckpointDone ───────────────┘

``daemon.inprocess.InProcessDaemon`` runs all four roles as threads of one process on the same
topology, for debugging and for the in-process tests.
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import SpaceError, SpaceSpec
from rlinkd.daemon.batch_schema import META_FIELDS, slot_columns
from rlinkd.daemon.config import Config
from rlinkd.daemon.errors import ConfigError
from rlinkd.daemon.ipc import Inbox, SharedFd
from rlinkd.daemon.roster import ROLES
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.blob import BlobArea
from rlinkd.shm.records import StepLayout
from rlinkd.shm.ring import StepRing
from rlinkd.shm.segment import sweep_stale
from rlinkd.shm.slots import BatchSlots

COUNTERS = ("env_steps", "episodes")  # kept by the collector, saved in every checkpoint
SHM_PREFIX = "rlinkd"


@dataclass
class Topology:
    """Everything the roles share. Made by ``build_topology``, owned by the supervisor."""

    cfg: Config
    obs_space: SpaceSpec
    act_space: SpaceSpec
    policy_spec: PolicySpec
    layout_sizes: tuple  # StepLayout(*layout_sizes): (obs_fields, action_size, dist_size), picklable
    inboxes: dict[str, Inbox]
    episode_ring_path: str
    board_path: str
    slots_path: str
    snapshot_path: str
    heartbeats: ctypes.Array[ctypes.c_double]  # mp Array('d', lock=False): a monotonic time per role
    episode_doorbell: SharedFd  # eventfd: collector rings it when the connector sleeps
    episode_space_doorbell: SharedFd  # eventfd: connector rings it when the collector waits for space
    counters: ctypes.Array[ctypes.c_longlong]  # mp Array('q', lock=False): COUNTERS, collector-written
    shm_prefix: str
    started_at: float = field(default_factory=time.time)
    resume_checkpoint: str = ""

    @property
    def layout(self) -> StepLayout:
        """The step-record layout (rebuilt per process: it holds a compiled struct)."""
        return StepLayout(*self.layout_sizes)

    def heartbeat(self, role: str) -> None:
        """Called by each role's loop at least every second or so."""
        self.heartbeats[ROLES.index(role)] = time.monotonic()

    def last_heartbeat(self, role: str) -> float:
        return self.heartbeats[ROLES.index(role)]

    def read_counters(self) -> dict:
        """The collector's counters as of now (checkpointer, supervisor)."""
        return {name: int(self.counters[i]) for i, name in enumerate(COUNTERS)}

    def write_counters(self, values: dict) -> None:
        """Collector only: publish its counters (cheap; called after every ingest)."""
        for i, name in enumerate(COUNTERS):
            self.counters[i] = int(values.get(name, 0))

    def segment_paths(self) -> list[str]:
        return [self.episode_ring_path, self.board_path, self.slots_path, self.snapshot_path]


def resolve_spaces(cfg: Config) -> tuple[SpaceSpec, SpaceSpec]:
    """Spaces from the config's explicit descriptions, else from the gymnasium id.

    Called once at start (by ``build_topology``). Raises ``ConfigError`` naming
    ``env.id`` when gymnasium cannot build that environment or its spaces are not
    Box/Discrete: the CLI prints one line and exits 78, as for any config mistake.
    """
    obs, act = cfg.env.observation_space, cfg.env.action_space
    if obs is not None and act is not None:
        return obs, act
    import gymnasium as gym
    try:
        env = gym.make(cfg.env.id)
    except Exception as exc:  # the gymnasium boundary: any failure is a config error
        raise ConfigError(f"env.id = {cfg.env.id!r}: gymnasium cannot make this environment "
                          f"({type(exc).__name__}: {exc})") from exc
    try:
        return (obs or SpaceSpec.from_gym(env.observation_space),
                act or SpaceSpec.from_gym(env.action_space))
    except SpaceError as exc:
        raise ConfigError(f"env.id = {cfg.env.id!r}: {exc}") from exc
    finally:
        env.close()


def make_policy_spec(cfg: Config, obs: SpaceSpec, act: SpaceSpec) -> PolicySpec:
    """The network every process agrees on (flat weight layout, ONNX graph)."""
    return PolicySpec(
        obs_size=obs.feature_size, obs_shape=(obs.n,) if obs.is_discrete else obs.shape,
        action_kind="discrete" if act.is_discrete else "box",
        action_size=act.n if act.is_discrete else act.flat_size,
        action_low=None if act.is_discrete else act.low,
        action_high=None if act.is_discrete else act.high,
        hidden_sizes=cfg.ppo.hidden_sizes, activation=cfg.ppo.activation,
        log_std_init=cfg.ppo.log_std_init)


def build_topology(cfg: Config) -> Topology:
    """Create every inbox and segment of one daemon instance (called once, by the supervisor)."""
    obs, act = resolve_spaces(cfg)
    spec = make_policy_spec(cfg, obs, act)
    layout = StepLayout.flat(obs.flat_size, act.flat_size, spec.dist_size)
    shm_dir = Path(cfg.daemon.shm_dir)
    sweep_stale(shm_dir, SHM_PREFIX)
    prefix = f"{SHM_PREFIX}.{os.getpid()}.{secrets.token_hex(4)}"
    path = lambda name: str(shm_dir / f"{prefix}.{name}")  # noqa: E731
    # collector → connector: every validated step, in ingest order (bounded: backpressure)
    ring = StepRing.create(path("episodes"), layout, _pow2(cfg.sampling.episode_ring_records))
    ring.close()
    # learner → collector (SET_STATE), connector (values), shm clients (inference)
    WeightsBoard.create(path("board"), spec.n_params(), _spec_json(spec)).close()
    # connector → learner: train batches; the learner inbox only carries slot doorbells
    rows = 2 * cfg.sampling.train_batch_size + cfg.sampling.env_steps_per_sample + 1024
    BatchSlots.create(path("slots"), slot_columns(spec), rows, cfg.sampling.batch_slots,
                      meta_fields=META_FIELDS).close()
    # learner → checkpointer: one serialised snapshot (model, optimizer, RNG, counters)
    BlobArea.create(path("snapshot"), cfg.checkpoint.snapshot_bytes).close()
    inboxes = {name: Inbox(name) for name in (*ROLES, "supervisor")}
    heartbeats = mp.get_context("spawn").Array("d", len(ROLES), lock=False)
    # collector → connector: "records in the episode ring" (the connector announced sleep)
    doorbell = SharedFd(Doorbell.create().fileno())
    # connector → collector: "space in the episode ring" (the collector announced it waits)
    space_doorbell = SharedFd(Doorbell.create().fileno())
    # collector → checkpointer/supervisor: env_steps, episodes (survives collector restarts)
    counters = mp.get_context("spawn").Array("q", len(COUNTERS), lock=False)
    return Topology(cfg=cfg, obs_space=obs, act_space=act, policy_spec=spec, layout_sizes=layout.sizes(),
                    inboxes=inboxes, episode_ring_path=path("episodes"),
                    board_path=path("board"), slots_path=path("slots"),
                    snapshot_path=path("snapshot"), heartbeats=heartbeats,
                    episode_doorbell=doorbell, episode_space_doorbell=space_doorbell,
                    counters=counters, shm_prefix=prefix)


def destroy_topology(topo: Topology) -> None:
    """Unlink every segment this topology created (idempotent); close the inboxes."""
    for p in topo.segment_paths():
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    for extra in Path(topo.cfg.daemon.shm_dir).glob(f"{topo.shm_prefix}.*"):
        extra.unlink(missing_ok=True)
    for inbox in topo.inboxes.values():
        inbox.close()
    topo.episode_doorbell.close()
    topo.episode_space_doorbell.close()


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _spec_json(spec: PolicySpec) -> bytes:
    import orjson
    return orjson.dumps(spec.to_json())
