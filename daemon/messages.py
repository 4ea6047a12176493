"""Every message that travels between the daemon's processes, by receiving inbox.

All are small control records (see ``daemon.ipc``); arrays never travel here.
"""
from __future__ import annotations

from rlinkd.daemon.ipc import message


# ---------------------------------------------------------------- to every role
@message
class Stop:
    """Supervisor → any role: finish what is in flight and exit 0."""

    reason: str


@message
class Reload:
    """Supervisor → any role: apply these reloadable settings (dotted keys)."""

    changes: dict


# ---------------------------------------------------------------- to the collector
@message
class WeightsPublished:
    """Learner → collector: the weights board holds ``seq_no``; it was trained on every
    episode record with ingest id <= ``cutoff_ingest_id`` (so on-policy waiters up to
    there may be answered). ``trained`` is False for an empty flush batch."""

    seq_no: int
    cutoff_ingest_id: int
    trained: bool
    stats: dict


@message
class ConnectorStats:
    """Connector → collector (periodic): what the pipeline dropped and holds."""

    dropped_episodes: int
    dropped_steps: int
    batches: int
    buffered_steps: int
    trained_steps: int


@message
class DaemonInfo:
    """Supervisor → collector (periodic): children, restarts, last checkpoint, for status."""

    info: dict


@message
class Drain:
    """Supervisor → collector: stop accepting, tell clients why (ERROR), close, exit 0."""

    reason: str


# ---------------------------------------------------------------- to the learner
@message
class BatchReady:
    """Connector → learner: a doorbell; the slot states in shared memory are the truth."""

    slot: int


@message
class SnapshotRequest:
    """Checkpointer → learner: serialise your full state into the snapshot area."""

    request_id: int


# ---------------------------------------------------------------- to the checkpointer
@message
class CheckpointRequest:
    """Supervisor → checkpointer: write a checkpoint now (timer, SIGUSR1, shutdown)."""

    request_id: int
    reason: str


@message
class SnapshotReady:
    """Learner → checkpointer: the snapshot area holds generation ``generation``."""

    request_id: int
    generation: int
    seq_no: int
    ok: bool
    error: str


# ---------------------------------------------------------------- to the supervisor
@message
class Listening:
    """Collector → supervisor: sockets are bound (the real TCP port when port = 0)."""

    host: str
    port: int
    unix_socket: str


@message
class CollectorStatus:
    """Collector → supervisor (periodic): counters for checkpoints and systemd STATUS."""

    status: dict


@message
class CheckpointDone:
    """Checkpointer → supervisor: a checkpoint request finished (ok or not)."""

    request_id: int
    reason: str
    ok: bool
    path: str
    seq_no: int
    error: str


@message
class LearnerReady:
    """Learner → supervisor: the model is loaded and its first weights are published."""

    seq_no: int
    resumed_from: str
