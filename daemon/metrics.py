"""TensorBoard scalars from the status stream, written by the supervisor.

Every ``CollectorStatus`` (once per ``status_interval_s``) becomes one TensorBoard event
at step = env_steps under ``<state_dir>/tensorboard``: episode return and length,
policy and value loss, KL, entropy, env steps/s, policy lag, connected clients; with
several policies, each other policy's return, version and learner stats under
``policy/<name>/``; evaluation episodes under ``eval/``, client metrics under ``client/``. An I/O
error disables the output (logged once); training never stops for metrics.
"""
from __future__ import annotations

from pathlib import Path

import structlog

from rlinkd.daemon.messages import CollectorStatus, LearnerState
from rlinkd.daemon.tboard import EventWriter

log = structlog.get_logger("metrics")

# TensorBoard tag → (part of CollectorStatus: "" itself, "update", "learner"; field)
SCALARS = {
    "episode/return_mean": ("", "episode_return_mean"),
    "episode/length_mean": ("", "episode_len_mean"),
    "throughput/env_steps_per_s": ("", "env_steps_per_s"),
    "clients/connected": ("", "clients"),
    "clients/dropped_episodes": ("", "dropped_episodes"),
    "learner/policy_loss": ("update", "policy_loss"),
    "learner/value_loss": ("update", "value_loss"),
    "learner/approx_kl": ("update", "approx_kl"),
    "learner/entropy": ("update", "entropy"),
    "learner/clip_frac": ("update", "clip_frac"),
    "learner/explained_variance": ("update", "explained_variance"),
    "learner/policy_lag": ("update", "policy_lag_max"),
    "learner/policy_lag_mean": ("update", "policy_lag_mean"),
    "learner/lr": ("learner", "lr"),
    "learner/ent_coef": ("learner", "ent_coef"),   # (SAC: the tuned alpha)
    "learner/loss": ("update", "loss"),
    "learner/q_mean": ("update", "q_mean"),
    "learner/td_abs_mean": ("update", "td_abs_mean"),
    "learner/epsilon": ("learner", "epsilon"),
    "learner/replay_steps": ("learner", "replay_steps"),
}


POLICY_SCALARS = {
    "episode/return_mean": ("", "episode_return_mean"),
    "weights_seq_no": ("", "weights_seq_no"),
    **{tag: where for tag, where in SCALARS.items() if where[0] in ("update", "learner")},
}
"""Tags written per policy other than the default, as ``policy/<name>/<tag>``."""


def scalars_from_status(status: CollectorStatus) -> dict[str, float]:
    """The TensorBoard scalars in one status report (missing values are left out): the
    default policy's under the plain tags, every other policy's under ``policy/<name>/``."""
    out = (_scalars(status, SCALARS, "") | _device_scalars(status.learner, "")
           | _cluster_scalars(status.learner))
    for name, digest in status.policies.items():
        out |= _scalars(digest, POLICY_SCALARS, f"policy/{name}/")
        out |= _device_scalars(digest.learner, f"policy/{name}/")
    return out | status.scalars


def _cluster_scalars(learner: LearnerState | None) -> dict[str, float]:
    """``cluster/world_size``, ``cluster/rank``, ``cluster/members``, ``cluster/generation``,
    ``cluster/collective_time_s`` and ``cluster/rows/<rank>`` for a rank of a job."""
    cluster = learner.cluster if learner is not None else None
    if cluster is None:
        return {}
    out = {"cluster/world_size": float(cluster.world_size), "cluster/rank": float(cluster.rank),
           "cluster/members": float(len(cluster.members)),
           "cluster/generation": float(cluster.generation),
           "cluster/collective_time_s": cluster.collective_time_s}
    return out | {f"cluster/rows/{rank}": float(n) for rank, n in enumerate(cluster.rows_per_rank)}


def _device_scalars(learner: LearnerState | None, prefix: str) -> dict[str, float]:
    """``learner/cuda_index`` (the CUDA device trained on, -1 for the CPU) and, when ``auto``
    timed the devices, ``learner/sgd_step_s/<device>``."""
    if learner is None or not learner.device:
        return {}
    index = int(learner.device.partition(":")[2] or 0) if learner.device.startswith("cuda") else -1
    out = {f"{prefix}learner/cuda_index": float(index)}
    for device, seconds in learner.device_step_s.items():
        out[f"{prefix}learner/sgd_step_s/{device.replace(':', '')}"] = seconds
    return out


def _scalars(source: object, table: dict[str, tuple[str, str]], prefix: str) -> dict[str, float]:
    out = {}
    for tag, (part, name) in table.items():
        value = getattr(getattr(source, part) if part else source, name, None)
        if value is not None:
            out[prefix + tag] = float(value)
    return out


class TensorBoardMetrics:
    """Lazily opens the event file on the first report; disables itself on I/O errors."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.writer: EventWriter | None = None
        self.disabled = False
        self.last_step = -1

    def record(self, status: CollectorStatus) -> None:
        step = status.env_steps
        if self.disabled or (step == self.last_step and not status.scalars):
            return  # (evaluation and client metrics come in without env steps)
        try:
            if self.writer is None:
                self.writer = EventWriter(self.directory)
            self.writer.add_scalars(step, scalars_from_status(status))
            self.writer.flush()
            self.last_step = step
        except OSError as exc:
            log.error("tensorboard_disabled", error=str(exc), directory=str(self.directory))
            self.disabled = True
            self.close()

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError:
                pass
            self.writer = None
