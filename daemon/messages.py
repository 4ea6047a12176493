"""Every message that travels between the daemon's processes, by receiving inbox.

All are small typed control records (see ``daemon.ipc``); arrays never travel here.
Each declaration names its receivers (``@message(to=...)``); each role dispatches
through one ``Router`` that handles, or explicitly ignores, every message addressed
to it, and is checked for that when it is built. Payloads are frozen
dataclasses, never bare dicts; a float that may be NaN is declared ``float | None``
(NaN travels as null).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.daemon.config import ConfigValue, check_reload_changes
from rlinkd.daemon.ipc import Misrouted, message, registered
from rlinkd.daemon.wiring import ROLES

SUPERVISOR = "supervisor"


# ---------------------------------------------------------------- to every role
@message(to=ROLES)
@dataclass(frozen=True)
class Stop:
    """Supervisor → any role: finish what is in flight and exit 0."""

    reason: str


@message(to=ROLES)
@dataclass(frozen=True)
class Reload:
    """Supervisor → any role: apply these reloadable settings (dotted keys; checked
    against the config's reloadable keys and their types when built or decoded)."""

    changes: dict[str, ConfigValue]

    def __post_init__(self) -> None:
        check_reload_changes(self.changes)


# ---------------------------------------------------------------- learner reports
@dataclass(frozen=True)
class ClusterState:
    """A rank's view of its job (``rlinkd status``: learner.cluster): ranks in the group now,
    groups this learner formed, the last update's seconds in collectives and rows per rank,
    and the digest of the weights it published last (equal on every rank in step)."""

    world_size: int
    rank: int
    members: tuple[int, ...]
    generation: int
    collective_time_s: float
    rows_per_rank: tuple[int, ...]
    weights_digest: str


@dataclass(frozen=True)
class LearnerState:
    """The learner's live hyperparameters and counters (with every WeightsPublished)."""

    lr: float
    ent_coef: float
    updates: int
    trained_steps: int
    rejected_batches: int
    algorithm: str = "ppo"
    epsilon: float | None = None     # dqn: the exploration rate clients apply now
    replay_steps: int | None = None  # off-policy: transitions in the replay buffer
    lag_steps: int | None = None     # off-policy: env steps the learner is behind its UTD schedule
    device: str = ""                 # where the policy trains ("cpu", "cuda:0")
    device_choice: str = ""          # why: fixed, only_cpu, measured, cached (device_choice)
    device_step_s: dict[str, float] = field(default_factory=dict)  # auto: s per SGD step by device
    cluster: ClusterState | None = None  # one rank of a job ([cluster] world_size > 1)


@dataclass(frozen=True)
class TrainStats:
    """What one update measured (means over its minibatch steps). A measurement that is not
    finite (extreme data, constant targets for explained variance) is None; policy lag is
    None when no behaviour version was known. Built by ``train_stats``."""

    loss: float | None
    policy_loss: float | None
    value_loss: float | None
    entropy: float | None
    approx_kl: float | None
    clip_frac: float | None
    grad_norm: float | None
    explained_variance: float | None
    epochs: int
    n_rows: int
    update_time_s: float
    policy_lag_max: int | None
    policy_lag_mean: float | None
    q_mean: float | None = None        # dqn, sac: mean Q(s, a) of the sampled transitions
    td_abs_mean: float | None = None   # dqn, sac: mean |Q(s, a) - target|


def train_stats(stats: dict[str, float], lag_max: int | None, lag_mean: float | None) -> TrainStats:
    """``Learner.update``'s stats and the batch's policy lag (``BatchMeta.policy_lag``) as
    the typed report."""
    return TrainStats(
        loss=_finite(stats["loss"]), policy_loss=_finite(stats["policy_loss"]),
        value_loss=_finite(stats["value_loss"]), entropy=_finite(stats["entropy"]),
        approx_kl=_finite(stats["approx_kl"]), clip_frac=_finite(stats["clip_frac"]),
        grad_norm=_finite(stats["grad_norm"]),
        explained_variance=_finite(stats["explained_variance"]), epochs=int(stats["epochs"]),
        n_rows=int(stats["n_rows"]), update_time_s=float(stats["update_time_s"]),
        policy_lag_max=lag_max, policy_lag_mean=lag_mean)


def off_policy_stats(stats: dict[str, float], updates: int, elapsed_s: float) -> TrainStats:
    """Means of an off-policy learner's gradient steps since its last publication (SAC adds
    its actor loss as policy_loss, critic loss as value_loss and the entropy estimate)."""
    optional = {key: _finite(stats[key]) if key in stats else None
                for key in ("actor_loss", "critic_loss", "entropy")}
    return TrainStats(
        loss=_finite(stats["loss"]), policy_loss=optional["actor_loss"],
        value_loss=optional["critic_loss"], entropy=optional["entropy"],
        approx_kl=None, clip_frac=None, grad_norm=_finite(stats["grad_norm"]),
        explained_variance=None, epochs=updates, n_rows=int(stats["n_rows"]),
        update_time_s=elapsed_s, policy_lag_max=None, policy_lag_mean=None,
        q_mean=_finite(stats["q_mean"]), td_abs_mean=_finite(stats["td_abs_mean"]))


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def learner_report(state: LearnerState | None, update: TrainStats | None) -> dict[str, Any]:
    """The ``learner`` section of ``rlinkd status`` (flat keys, as the JSON contract has them)."""
    return {**(asdict(update) if update else {}), **(asdict(state) if state else {})}


# ---------------------------------------------------------------- to the collector
@message(to="collector")
@dataclass(frozen=True)
class WeightsPublished:
    """Learner → collector: the weights board holds ``seq_no``; it was trained on every
    episode record with ingest id <= ``cutoff_ingest_id`` (so on-policy waiters up to
    there may be answered). ``update`` is None when nothing was trained (boot, an empty
    flush batch, a rejected batch, a hyperparameter reload)."""

    seq_no: int
    cutoff_ingest_id: int
    learner: LearnerState
    update: TrainStats | None
    policy: str = DEFAULT_POLICY  # whose board, whose episode ring's ingest ids

    @property
    def trained(self) -> bool:
        return self.update is not None


@message(to="collector")
@dataclass(frozen=True)
class ConnectorStats:
    """Connector → collector (periodic): what the pipeline dropped and holds, and the state
    of each batch slot (``shm.slots``: FREE, FILLING, READY, TRAINING) as it saw them."""

    dropped_episodes: int
    dropped_steps: int
    batches: int
    buffered_steps: int
    trained_steps: int
    slot_states: tuple[int, ...]
    policy: str = DEFAULT_POLICY


@message(to="collector")
@dataclass(frozen=True)
class ConnectorLag:
    """Connector → collector, when it changes (APPO with ``appo.max_lead_steps``): env steps
    of the policy waiting for the learner (read, not yet in a batch). The collector's pacer
    holds sampling clients while it (plus what was ingested since) exceeds the limit."""

    policy: str
    lag_steps: int


@message(to="collector")
@dataclass(frozen=True)
class InferenceStats:
    """Inference → collector (periodic): what the serving role did since it started."""

    requests: int              # lane requests answered (actions, ends, errors)
    actions: int               # actions chosen
    batches: int               # forward passes
    errors: int                # requests answered with an error status
    lanes_open: int            # episodes open on every lane area
    areas: int                 # lane areas served (shm clients' + the role's own for direct connections)
    held: tuple[str, ...]      # policies whose training requests wait for new weights
    batch_sizes: dict[str, int]  # "<=N" (batch-size bucket) -> forward passes
    backends: dict[str, str]     # policy -> backend
    cpu_s: float                 # the role's process CPU time
    weights_seq_nos: dict[str, int] = field(default_factory=dict)
    direct: dict[str, int] = field(default_factory=dict)  # serving connections' counts (DirectConnections.report)
    lanes_free: dict[str, int] = field(default_factory=dict)  # policy -> lanes free for serving connections
    errors_by_kind: dict[str, int] = field(default_factory=dict)  # their protocol errors (error_kind)
    started_at: float = 0.0  # when this role process started (a new one counts from 0 again)
    native_parts: tuple[str, ...] = ()  # the native parts serving now (inference.native_parts)


def inference_report(msg: InferenceStats) -> dict:
    """The ``inference`` status section from the role's report."""
    return {"requests": msg.requests, "actions": msg.actions, "batches": msg.batches,
            "errors": msg.errors, "lanes_open": msg.lanes_open, "areas": msg.areas,
            "held": list(msg.held),
            "mean_batch_size": round(msg.actions / msg.batches, 2) if msg.batches else None,
            "batch_sizes": dict(msg.batch_sizes), "backends": dict(msg.backends),
            "cpu_s": round(msg.cpu_s, 2),
            "cpu_ms_per_1000_actions": round(1e6 * msg.cpu_s / msg.actions, 2) if msg.actions else None,
            "weights_seq_nos": dict(msg.weights_seq_nos), "native_parts": list(msg.native_parts),
            **msg.direct, "tcp_lanes_free": dict(msg.lanes_free)}


@dataclass(frozen=True)
class ChildInfo:
    """One role process as the supervisor sees it."""

    pid: int | None
    restarts: int
    alive: bool
    last_exit: int | None


@dataclass(frozen=True)
class CheckpointInfo:
    """The newest checkpoint written or resumed from."""

    path: str
    weights_seq_no: int
    created_at: float
    request_id: int = 0  # the request it answered (0: the checkpoint the daemon resumed)


@dataclass(frozen=True)
class CheckpointFailure:
    """The newest checkpoint request that failed, and why."""

    request_id: int
    reason: str
    error: str
    at: float


@dataclass(frozen=True)
class ReloadResult:
    """The outcome of the last SIGHUP (``error`` is empty when ``ok``)."""

    generation: int
    ok: bool
    at: float
    applied: dict[str, ConfigValue]
    needs_restart: tuple[str, ...]
    error: str


@message(to="collector")
@dataclass(frozen=True)
class DaemonInfo:
    """Supervisor → collector (periodic): the supervisor's part of ``rlinkd status``."""

    daemon_pid: int
    state: str
    children: dict[str, ChildInfo]
    last_checkpoint: CheckpointInfo | None
    checkpoints_written: int
    checkpoints_failed: int
    last_checkpoint_failure: CheckpointFailure | None
    signal_checkpoint_request: int  # the newest SIGUSR1 request's id (0: none yet)
    undelivered_messages: int
    reload_generation: int
    last_reload: ReloadResult | None
    state_dir: str
    config: dict[str, ConfigValue]
    metrics_url: str  # the Prometheus endpoint ("" when metrics.listen is off)


def daemon_report(info: DaemonInfo) -> dict[str, Any]:
    """``info`` as the flat keys of ``rlinkd status`` (absent checkpoint, failure, reload: ``{}``)."""
    report = asdict(info)
    for key in ("last_checkpoint", "last_checkpoint_failure", "last_reload"):
        report[key] = report[key] or {}
    if info.last_checkpoint is not None:
        report["last_checkpoint"]["age_s"] = round(time.time() - info.last_checkpoint.created_at, 1)
    return report


@message(to="collector")
@dataclass(frozen=True)
class Drain:
    """Supervisor → collector: stop accepting, tell clients why (ERROR), close, exit 0."""

    reason: str


# ---------------------------------------------------------------- to the learner
@message(to="learner")
@dataclass(frozen=True)
class BatchReady:
    """Connector → learner: a doorbell; the slot states in shared memory are the truth."""

    slot: int
    policy: str = DEFAULT_POLICY


@message(to="learner")
@dataclass(frozen=True)
class SnapshotRequest:
    """Checkpointer → learner: serialise your full state into the snapshot area."""

    request_id: int


# ---------------------------------------------------------------- to the checkpointer
@message(to="checkpointer")
@dataclass(frozen=True)
class CheckpointRequest:
    """Supervisor → checkpointer: write a checkpoint now (timer, SIGUSR1, shutdown)."""

    request_id: int
    reason: str


@message(to="checkpointer")
@dataclass(frozen=True)
class SnapshotReady:
    """Learner → checkpointer: each trainable policy's snapshot area holds the generation
    ``generations[policy]`` of its state, at weights version ``seq_nos[policy]``.
    ``counters`` are the collector's counters (``wiring.COUNTERS``) read when that state was
    serialised: the checkpoint records these, not newer ones read when it is written."""

    request_id: int
    generations: dict[str, int]
    seq_nos: dict[str, int]
    ok: bool
    error: str
    counters: dict[str, int]

    @property
    def seq_no(self) -> int:
        """The default policy's version (what a checkpoint is listed under)."""
        return self.seq_nos.get(DEFAULT_POLICY, -1)


# ---------------------------------------------------------------- to the supervisor
@message(to=SUPERVISOR)
@dataclass(frozen=True)
class Listening:
    """Collector → supervisor: sockets are bound (the real TCP port when port = 0)."""

    host: str
    port: int
    unix_socket: str


@dataclass(frozen=True)
class PolicyDigest:
    """One more policy's figures in a CollectorStatus (TensorBoard ``policy/<name>/...``)."""

    weights_seq_no: int
    episodes: int
    episode_return_mean: float | None
    learner: LearnerState | None
    update: TrainStats | None


@message(to=SUPERVISOR)
@dataclass(frozen=True)
class CollectorStatus:
    """Collector → supervisor (periodic): what TensorBoard and systemd's STATUS= show."""

    env_steps: int
    episodes: int
    env_steps_per_s: float
    episode_return_mean: float | None
    episode_len_mean: float | None
    weights_seq_no: int
    clients: int
    dropped_episodes: int
    learner: LearnerState | None
    update: TrainStats | None
    policies: dict[str, PolicyDigest] = field(default_factory=dict)  # every other policy
    scalars: dict[str, float] = field(default_factory=dict)  # more TensorBoard tags: eval/*, client/*


@message(to=SUPERVISOR)
@dataclass(frozen=True)
class CheckpointDone:
    """Checkpointer → supervisor: a checkpoint request finished (ok or not)."""

    request_id: int
    reason: str
    ok: bool
    path: str
    seq_no: int
    error: str


@message(to=SUPERVISOR)
@dataclass(frozen=True)
class LearnerReady:
    """Learner → supervisor: the model is loaded and its first weights are published."""

    seq_no: int
    resumed_from: str


# ---------------------------------------------------------------- routing
def addressed_to(role: str) -> frozenset[type]:
    """Every message class whose declaration names ``role`` as a receiver."""
    return frozenset(cls for cls in registered().values() if role in getattr(cls, "RECEIVERS", ()))


class Router:
    """One role's dispatcher: a handler per message addressed to the role, or an explicit
    ignore. Built once per role shell; raises Misrouted at construction when the table
    and the declarations disagree (a message unhandled, or handled but not addressed
    here), and at dispatch for a message not addressed to the role."""

    def __init__(self, role: str, handlers: dict[type, Callable[[Any], Any]],
                 ignore: Iterable[type] = ()) -> None:
        self.role, self.handlers, self.ignore = role, dict(handlers), frozenset(ignore)
        addressed, listed = addressed_to(role), set(self.handlers) | self.ignore
        problems = {"unhandled": addressed - listed, "not addressed here": listed - addressed,
                    "both handled and ignored": set(self.handlers) & self.ignore}
        named = {k: sorted(c.__name__ for c in v) for k, v in problems.items() if v}
        if named:
            raise Misrouted(f"router of {role!r}: {named}")

    def __call__(self, msg: Any) -> Any:
        """Run the handler for ``msg`` (None for an ignored message)."""
        handler = self.handlers.get(type(msg))
        if handler is not None:
            return handler(msg)
        if type(msg) not in self.ignore:
            raise Misrouted(f"{self.role} got {type(msg).__name__}, not addressed to it")
        return None
