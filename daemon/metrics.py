"""TensorBoard scalars from the status stream, written by the supervisor.

Every ``CollectorStatus`` (once per ``status_interval_s``) becomes one TensorBoard event
at step = env_steps under ``<state_dir>/tensorboard``: episode return and length,
policy and value loss, KL, entropy, env steps/s, policy lag, connected clients. An I/O
error disables the output (logged once); training never stops for metrics.
"""
from __future__ import annotations

from pathlib import Path

import structlog

from rlinkd.daemon.tboard import EventWriter

log = structlog.get_logger("metrics")

# TensorBoard tag → (status key, learner-stats key)
SCALARS = {
    "episode/return_mean": ("episode_return_mean", None),
    "episode/length_mean": ("episode_len_mean", None),
    "throughput/env_steps_per_s": ("env_steps_per_s", None),
    "clients/connected": ("clients", None),
    "clients/dropped_episodes": ("dropped_episodes", None),
    "learner/policy_loss": (None, "policy_loss"),
    "learner/value_loss": (None, "value_loss"),
    "learner/approx_kl": (None, "approx_kl"),
    "learner/entropy": (None, "entropy"),
    "learner/clip_frac": (None, "clip_frac"),
    "learner/explained_variance": (None, "explained_variance"),
    "learner/policy_lag": (None, "policy_lag_max"),
    "learner/policy_lag_mean": (None, "policy_lag_mean"),
    "learner/lr": (None, "lr"),
}


def scalars_from_status(status: dict) -> dict[str, float]:
    """The TensorBoard scalars in one status report (missing values are left out)."""
    learner = status.get("learner") or {}
    out = {}
    for tag, (key, learner_key) in SCALARS.items():
        value = status.get(key) if key else learner.get(learner_key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[tag] = float(value)
    return out


class TensorBoardMetrics:
    """Lazily opens the event file on the first report; disables itself on I/O errors."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.writer: EventWriter | None = None
        self.disabled = False
        self.last_step = -1

    def record(self, status: dict) -> None:
        step = int(status.get("env_steps", 0))
        if self.disabled or step == self.last_step:
            return
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
