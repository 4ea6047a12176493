"""Shared-memory clients on the collector side: attach, validate ring records, detach.

A co-located client connects to the Unix socket, sends ATTACH, and gets its own
StepRing (created here, mode 0600, in ``daemon.shm_dir``) plus the weights board and
the doorbell FIFO to wake us. It then writes step records into its ring (batch or
single steps) and sends SAMPLE_READY when a sample is complete. The collector
drains every ring whenever the doorbell rings (and on a slow safety tick),
validates the records vectorised (flags, finite numbers, spaces), stamps the
client's stream id, and forwards them to the episode ring like TCP episodes. When
the client's socket closes (exit, crash, SIGKILL) its ring is unlinked at once.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from client_lib.spaces import SpaceSpec, check_values
from daemon.collector.ingest import InvalidEpisode
from shm.records import (FINAL_OBS, HAS_DIST, HAS_LOGP, TERMINATED, TRUNCATED, StepLayout)
from shm.ring import StepRing, arm_sleep

CLIENT_FLAGS = FINAL_OBS | TERMINATED | TRUNCATED | HAS_LOGP | HAS_DIST
DEFAULT_RING_RECORDS = 1 << 15
MAX_RING_RECORDS = 1 << 20


@dataclass
class ShmSession:
    """One attached client's ring and episode accounting."""

    ring: StepRing
    open_return: float = 0.0
    open_length: int = 0
    last_ingest_id: int = 0
    drained: int = 0
    done_episodes: list = field(default_factory=list)


def ring_capacity(requested: int | None) -> int:
    n = min(max(int(requested or DEFAULT_RING_RECORDS), 1024), MAX_RING_RECORDS)
    return 1 << (n - 1).bit_length()


class ShmClients:
    """Rings of attached clients, keyed by session id. Used only by the event loop."""

    def __init__(self, shm_dir: str, prefix: str, layout: StepLayout, obs_space: SpaceSpec,
                 act_space: SpaceSpec) -> None:
        self.shm_dir, self.prefix = Path(shm_dir), prefix
        self.layout, self.obs_space, self.act_space = layout, obs_space, act_space
        self.sessions: dict[int, ShmSession] = {}
        self.remove_orphans()

    def remove_orphans(self) -> list[Path]:
        """Rings left by a previous collector of this daemon (their clients are gone)."""
        orphans = list(self.shm_dir.glob(f"{self.prefix}.client-*"))
        for path in orphans:
            path.unlink(missing_ok=True)
        return orphans

    def attach(self, session_id: int, capacity: int | None) -> StepRing:
        """Create the ring for one client (0600, our user). Called on ATTACH."""
        name = f"{self.prefix}.client-{session_id}-{secrets.token_hex(4)}"
        ring = StepRing.create(str(self.shm_dir / name), self.layout, ring_capacity(capacity),
                               mode=0o600)
        self.sessions[session_id] = ShmSession(ring)
        return ring

    def detach(self, session_id: int) -> None:
        """Forget a client and unlink its ring (idempotent)."""
        shm = self.sessions.pop(session_id, None)
        if shm is not None:
            path = shm.ring.path
            shm.ring.close()
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def read(self, session_id: int, max_records: int) -> np.ndarray:
        """Validated records from one client's ring (raises InvalidEpisode on bad data)."""
        shm = self.sessions[session_id]
        rec = shm.ring.read_batch(max_records)
        if len(rec):
            validate_records(rec, self.obs_space, self.act_space)
            shm.drained += len(rec)
            shm.done_episodes.extend(self._episodes(shm, rec))
        return rec

    def readable(self) -> list[int]:
        return [sid for sid, s in self.sessions.items() if s.ring.readable_records()]

    def arm(self) -> bool:
        """Announce that the collector sleeps; True if a ring became readable meanwhile."""
        rings = [s.ring for s in self.sessions.values()]
        return arm_sleep(rings) if rings else False

    @staticmethod
    def _episodes(shm: ShmSession, rec: np.ndarray) -> list[tuple[float, int]]:
        """(return, length) of episodes these records complete; carries partial sums."""
        out = []
        is_step = (rec["flags"] & FINAL_OBS) == 0
        start = 0
        for end in np.flatnonzero(~is_step):
            steps = rec["reward"][start:end]
            shm.open_return += float(steps.sum())
            shm.open_length += end - start
            if rec["flags"][end] & (TERMINATED | TRUNCATED):
                out.append((shm.open_return, shm.open_length))
                shm.open_return, shm.open_length = 0.0, 0
            start = end + 1
        shm.open_return += float(rec["reward"][start:].sum())
        shm.open_length += len(rec) - start
        return out

    def close(self) -> None:
        for sid in list(self.sessions):
            self.detach(sid)


def validate_records(rec: np.ndarray, obs_space: SpaceSpec, act_space: SpaceSpec) -> None:
    """Every record must carry known flags, finite numbers and values inside the spaces."""
    flags = rec["flags"]
    if np.any(flags & np.uint8(0xFF ^ CLIENT_FLAGS)):
        raise InvalidEpisode("ring record with unknown or reserved flags")
    if np.any(((flags & (TERMINATED | TRUNCATED)) != 0) & ((flags & FINAL_OBS) == 0)):
        raise InvalidEpisode("TERMINATED/TRUNCATED set on a record that is not FINAL_OBS")
    obs = rec["obs"].reshape(len(rec), *_shape(obs_space))
    steps = rec[(flags & FINAL_OBS) == 0]
    actions = steps["action"].reshape(len(steps), *_shape(act_space))
    errors = (check_values(obs, obs_space, "ring obs"),
              check_values(actions, act_space, "ring actions"),
              _finite(steps["reward"], "ring rewards"),
              _finite(steps["logp"][(steps["flags"] & HAS_LOGP) != 0], "ring action_logp"),
              _finite(steps["dist"][(steps["flags"] & HAS_DIST) != 0], "ring dist inputs"))
    error = next((e for e in errors if e), None)
    if error:
        raise InvalidEpisode(error)


def _shape(space: SpaceSpec) -> tuple[int, ...]:
    return () if space.is_discrete else space.shape


def _finite(values: np.ndarray, what: str) -> str | None:
    if values.size and not np.all(np.isfinite(values)):
        return f"{what}: contains NaN or Inf"
    return None
