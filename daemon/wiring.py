"""The daemon's topology, made in one place: every inbox and shared-memory segment.

Roles never create their own IPC; they receive a ``Topology`` (picklable into
``spawn``ed children: inbox fds are passed, segments are attached by path).

One pipeline per trainable policy (``PolicyTopology``: episode ring, weights board, batch
slots, snapshot area); a frozen policy has only its board. Per policy:

    clients ──TCP/Unix──▶ collector ──episode ring (shm)──▶ connector
                             ▲                                  │
                             │ WeightsPublished        batch slots (shm) + BatchReady
                             │                                  ▼
       weights board (shm) ◀─┴──────────────────────────── learner ──snapshot area (shm)──▶ checkpointer
                                                                                              │
    supervisor ◀── Listening / CollectorStatus / LearnerReady / CheckpointDone ───────────────┘

Server-side actions (the ``inference`` role) add request/response lanes in shared memory:

    shm action client ──lane area (memfd)──▶ inference ──episode ring (as an internal client)──▶ collector
    TCP action client ──▶ collector ──TCP lane area (file, per policy)──▶ inference
                             └──area channel (socketpair: memfds + doorbells)──▶ inference
    TCP action client after SERVE_DIRECT ──(its socket, over the area channel)──▶ inference

``daemon.inprocess.InProcessDaemon`` runs all four roles as threads of one process on the same
topology, for debugging and for the in-process tests.
"""
from __future__ import annotations

import ctypes
import dataclasses
import multiprocessing as mp
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY, PolicyMapping
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Space, record_fields
from rlinkd.daemon import policies
from rlinkd.daemon.batch_schema import META_FIELDS, slot_columns
from rlinkd.daemon.config import Config, batch_slot_rows
from rlinkd.daemon.policies import PolicyDef
from rlinkd.daemon.ipc import Inbox, SharedFd
from rlinkd.daemon.roster import ROLES
from rlinkd.daemon.serving.channel import make_pair
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.lanes import LaneLayout
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.blob import BlobArea
from rlinkd.shm.records import StepLayout
from rlinkd.shm.replay import ReplayBuffer, ReplayLayout
from rlinkd.shm.ring import StepRing
from rlinkd.shm.segment import sweep_stale
from rlinkd.shm.slots import BatchSlots

COUNTERS = ("env_steps", "episodes")  # kept by the collector, saved in every checkpoint
SHM_PREFIX = "rlinkd"


@dataclass
class PolicyTopology:
    """One policy's pipeline: its definition, its record layout and its segments.

    A trainable policy has all four segments; a frozen one only its weights board (it is
    never trained: its episodes are counted by the collector and go nowhere else).
    """

    definition: PolicyDef
    layout_json: dict  # StepLayout.to_json(): per-leaf obs fields, action and dist sizes
    board_path: str
    episode_ring_path: str = ""
    slots_path: str = ""
    snapshot_path: str = ""
    replay_path: str = ""     # off-policy algorithms: the replay buffer (instead of batch slots)

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def obs_space(self) -> Space:
        return self.definition.obs_space

    @property
    def act_space(self) -> Space:
        return self.definition.act_space

    @property
    def spec(self) -> PolicySpec:
        return self.definition.spec

    @property
    def trainable(self) -> bool:
        return self.definition.trainable

    @property
    def off_policy(self) -> bool:
        """Its clients never wait for training (DQN, APPO)."""
        return self.definition.off_policy

    @property
    def uses_replay(self) -> bool:
        """Trained from ``replay_path`` (no batch slots): DQN."""
        return self.definition.uses_replay

    @property
    def layout(self) -> StepLayout:
        """The step-record layout (rebuilt per process: it holds a compiled struct)."""
        return StepLayout.from_json(self.layout_json)

    def segment_paths(self) -> list[str]:
        return [p for p in (self.episode_ring_path, self.board_path, self.slots_path,
                            self.snapshot_path, self.replay_path) if p]


@dataclass
class Topology:
    """Everything the roles share. Made by ``build_topology``, owned by the supervisor."""

    cfg: Config
    policies: dict[str, PolicyTopology]  # by name, DEFAULT_POLICY first
    inboxes: dict[str, Inbox]
    heartbeats: ctypes.Array[ctypes.c_double]  # mp Array('d', lock=False): a monotonic time per role
    episode_doorbell: SharedFd  # eventfd shared by every episode ring: the collector rings it
    episode_space_doorbell: SharedFd  # eventfd: connector rings it when the collector waits for space
    counters: ctypes.Array[ctypes.c_longlong]  # mp Array('q', lock=False): COUNTERS, collector-written
    shm_prefix: str
    request_doorbell: SharedFd  # eventfd: action clients (and the collector) wake the inference role
    area_channel: tuple[SharedFd, SharedFd]  # socketpair (collector end, inference end)
    internal_token: str  # the inference role's credential as the collector's internal client
    started_at: float = field(default_factory=time.time)
    resume_checkpoint: str = ""

    @property
    def default(self) -> PolicyTopology:
        """The policy single-agent clients use (always present)."""
        return self.policies[DEFAULT_POLICY]

    @property
    def mapping(self) -> PolicyMapping:
        return self.cfg.policy_mapping

    def trainable(self) -> list[PolicyTopology]:
        """Policies with a pipeline (episode ring, slots, snapshot), in declaration order."""
        return [p for p in self.policies.values() if p.trainable]

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
        return [path for p in self.policies.values() for path in p.segment_paths()]


def resolve_spaces(cfg: Config) -> tuple[Space, Space]:
    """The default policy's spaces from [env] (explicit, else from the gymnasium id)."""
    return policies.resolve_spaces(cfg.env.id, cfg.env.observation_space, cfg.env.action_space,
                                   "env")


def make_policy_spec(cfg: Config, obs: Space, act: Space) -> PolicySpec:
    """The default policy's network for these spaces and [ppo]/[env] (ConfigError if they
    do not fit together)."""
    return policies.make_policy_spec(cfg.ppo, obs, act, cfg.env.action_mask_key)


def build_topology(cfg: Config) -> Topology:
    """Create every inbox and segment of one daemon instance (called once, by the supervisor)."""
    defs = policies.policy_defs(cfg)
    shm_dir = Path(cfg.daemon.shm_dir)
    sweep_stale(shm_dir, SHM_PREFIX)
    prefix = f"{SHM_PREFIX}.{os.getpid()}.{secrets.token_hex(4)}"
    path = lambda name: str(shm_dir / f"{prefix}.{name}")  # noqa: E731
    made = {name: _policy_segments(cfg, d, path) for name, d in defs.items()}
    inboxes = {name: Inbox(name) for name in (*ROLES, "supervisor")}
    heartbeats = mp.get_context("spawn").Array("d", len(ROLES), lock=False)
    # collector → connector: "records in an episode ring" (the connector announced sleep)
    doorbell = SharedFd(Doorbell.create().fileno())
    # connector → collector: "space in the episode ring" (the collector announced it waits)
    space_doorbell = SharedFd(Doorbell.create().fileno())
    # collector → checkpointer/supervisor: env_steps, episodes (survives collector restarts)
    counters = mp.get_context("spawn").Array("q", len(COUNTERS), lock=False)
    # action clients, collector → inference: "a lane holds a request" (rung if it announced sleep)
    request_doorbell = SharedFd(Doorbell.create().fileno())
    # collector ⇄ inference: shm action clients' lane areas and response doorbells, and the
    # sockets of serving connections handed over at their first serving message (fds)
    collector_end, inference_end = make_pair()
    return Topology(cfg=cfg, policies=made, inboxes=inboxes, heartbeats=heartbeats,
                    episode_doorbell=doorbell, episode_space_doorbell=space_doorbell,
                    counters=counters, shm_prefix=prefix, request_doorbell=request_doorbell,
                    area_channel=(SharedFd(collector_end), SharedFd(inference_end)),
                    internal_token=secrets.token_hex(16))


def step_layout(d: PolicyDef) -> StepLayout:
    """The step-record layout of one policy's rings: a field per observation leaf."""
    return StepLayout(record_fields(d.obs_space), d.act_space.action_size, d.spec.dist_size,
                      d.spec.state_size)


def _policy_segments(cfg: Config, d: PolicyDef, path) -> PolicyTopology:
    """One policy's segments, named ``<prefix>.<kind>.<policy>``."""
    layout = step_layout(d)
    # learner → collector (SET_STATE), connector (values), shm clients (inference)
    board = path(f"board.{d.name}")
    WeightsBoard.create(board, d.spec.n_params(), _spec_json(d.spec)).close()
    topo = PolicyTopology(d, layout.to_json(), board)
    if not d.trainable:
        return topo
    # collector → connector: every validated step of this policy, in ingest order (bounded)
    topo.episode_ring_path = path(f"episodes.{d.name}")
    StepRing.create(topo.episode_ring_path, layout, ring_records(
        cfg.sampling.episode_ring_records, layout.record_bytes)).close()
    if d.uses_replay:
        # connector → learner: n-step transitions; outlives a learner restart
        topo.replay_path = path(f"replay.{d.name}")
        ReplayBuffer.create(topo.replay_path, ReplayLayout(layout), d.replay_hp.buffer_size_steps).close()
    else:
        # connector → learner: train batches; the learner inbox only carries slot doorbells
        rows = batch_slot_rows(cfg.sampling)
        topo.slots_path = path(f"slots.{d.name}")
        BatchSlots.create(topo.slots_path, slot_columns(d.spec), rows, cfg.sampling.batch_slots,
                          meta_fields=META_FIELDS).close()
    # learner → checkpointer: one serialised snapshot (model, optimizer, RNG) of this policy
    topo.snapshot_path = path(f"snapshot.{d.name}")
    BlobArea.create(topo.snapshot_path, cfg.checkpoint.snapshot_bytes).close()
    return topo


def reconfigured(topo: Topology, cfg: Config, changes: dict) -> Topology:
    """The topology under a reloaded config (supervisor, after SIGHUP). Reloaded ``ppo.*``,
    ``dqn.*`` and ``sac.*`` keys apply to every policy without its own table for that section,
    ``policies.NAME.<section>.*`` keys to that policy only (``policies.reloaded_sections``),
    as the running learner applies them, so a learner restarted later trains with them too."""
    def updated(name: str, p: PolicyTopology) -> PolicyTopology:
        parts = policies.reloaded_sections(cfg, name, changes)
        if not parts:
            return p
        return dataclasses.replace(p, definition=dataclasses.replace(p.definition, **{
            section: dataclasses.replace(getattr(p.definition, section), **values)
            for section, values in parts.items()}))
    return dataclasses.replace(topo, cfg=cfg, policies={
        name: updated(name, p) for name, p in topo.policies.items()})


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
    for fd in (topo.request_doorbell, *topo.area_channel):
        fd.close()


TCP_LANES_MAX_BYTES = 64 << 20


def tcp_lane_capacity(configured: int, lanes: LaneLayout) -> int:
    """``inference.tcp_lanes``, but at most TCP_LANES_MAX_BYTES of lanes (image observations)
    and at least 64 lanes."""
    return max(64, min(configured, TCP_LANES_MAX_BYTES // lanes.lane_bytes))


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


EPISODE_RING_MAX_BYTES = 1 << 30


def ring_records(configured: int, record_bytes: int) -> int:
    """The episode ring's capacity: ``sampling.episode_ring_records`` rounded up to a power
    of two, but at most EPISODE_RING_MAX_BYTES of records (an 84x84x3 image record is
    21 KB: 2**17 of them would be 2.8 GB) and at least 1024 records."""
    cap = max(1024, 1 << ((EPISODE_RING_MAX_BYTES // record_bytes).bit_length() - 1))
    return min(_pow2(configured), cap)


def _spec_json(spec: PolicySpec) -> bytes:
    import orjson
    return orjson.dumps(spec.to_json())
