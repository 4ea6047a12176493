"""Shared-memory clients on the collector side: attach, validate ring records, detach.

A co-located client connects to the Unix socket, sends ATTACH, and gets its own
StepRing plus the weights board and the doorbell FIFO to wake us. The ring is a
sealed memfd created here (``StepRing.create_sealed``) and handed over as a file
descriptor, never a path: its size is sealed, so the client cannot shrink it under
our mapping (before, a client that truncated its ring file killed the collector
with SIGBUS). It then writes step records into its ring (batch or
single steps) and sends SAMPLE_READY when a sample is complete. The collector
drains every ring whenever the doorbell rings (and on a slow safety tick),
validates the records vectorised (flags, finite numbers, spaces), stamps the
client's stream id, and forwards them to the episode ring like TCP episodes. When
the client's socket closes (exit, crash, SIGKILL) its ring is closed at once (the
memory goes when the client's mapping goes too; a collector that dies takes its
memfds with it, so there are no orphan rings to sweep).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import numpy as np

from rlinkd.client_lib.protocol.columns import Columns, check_action_vector
from rlinkd.client_lib.protocol.masking import MaskSpec, check_actions, check_masks
from rlinkd.client_lib.protocol.records import read_obs
from rlinkd.client_lib.protocol.spaces import Space
from rlinkd.daemon.collector.ingest import InvalidEpisode, Spaces
from rlinkd.shm.records import FINAL_OBS, HAS_DIST, HAS_LOGP, TERMINATED, TRUNCATED, StepLayout
from rlinkd.shm.ring import StepRing, arm_sleep

CLIENT_FLAGS = FINAL_OBS | TERMINATED | TRUNCATED | HAS_LOGP | HAS_DIST
DEFAULT_RING_RECORDS = 1 << 15
MAX_RING_RECORDS = 1 << 20


@dataclass
class ShmSession:
    """One attached client's ring and episode accounting."""

    ring: StepRing
    pid: int | None = None         # the attaching process (SO_PEERCRED), watched for exit
    open_return: float = 0.0
    open_length: int = 0
    last_ingest_id: int = 0
    done_episodes: list = field(default_factory=list)
    refused: str | None = None     # why its ring was found bad; never read again
    leaving: bool = False          # its connection closed: only the detach drain reads it now


DEFAULT_RING_BYTES = 64 << 20
MAX_RING_BYTES = 256 << 20


def ring_capacity(requested: int | None, record_bytes: int) -> int:
    """A client ring's records: what it asked for (else the default), a power of two, at
    least 1024, at most MAX_RING_RECORDS and MAX_RING_BYTES (the default also at most
    DEFAULT_RING_BYTES: image records are ~21 KB each)."""
    limit = MAX_RING_BYTES if requested else DEFAULT_RING_BYTES
    by_bytes = 1 << max(10, (limit // record_bytes).bit_length() - 1)
    n = min(max(int(requested or DEFAULT_RING_RECORDS), 1024), MAX_RING_RECORDS)
    return min(1 << (n - 1).bit_length(), by_bytes)


class ShmClients:
    """Rings of attached clients, keyed by session id. Used only by the event loop."""

    def __init__(self, prefix: str, layout: StepLayout, spaces: Spaces) -> None:
        self.prefix = prefix
        self.layout, self.spaces = layout, spaces
        self.sessions: dict[int, ShmSession] = {}

    def attach(self, session_id: int, capacity: int | None, pid: int | None = None) -> StepRing:
        """Create the sealed ring of one client; ``ring.segment.fd`` is what to hand it.

        Called on ATTACH. Raises ``ShmError`` (no memory) or ``OSError`` (memfds or
        seals unavailable); nothing is registered then.
        """
        name = f"{self.prefix}.client-{session_id}-{secrets.token_hex(4)}"
        ring = StepRing.create_sealed(name, self.layout,
                                      ring_capacity(capacity, self.layout.record_bytes))
        self.sessions[session_id] = ShmSession(ring, pid)
        return ring

    def gone(self) -> list[int]:
        """Sessions whose attaching process has exited (its socket may live on in a child)."""
        return [sid for sid, s in self.sessions.items() if s.pid and not pid_alive(s.pid)]

    def detach(self, session_id: int) -> None:
        """Forget a client and close its ring: our mapping and our descriptor (idempotent)."""
        shm = self.sessions.pop(session_id, None)
        if shm is not None:
            shm.ring.close()

    def read(self, session_id: int, max_records: int) -> np.ndarray:
        """Validated records from one client's ring.

        Raises InvalidEpisode on bad data; from then on the ring is refused (every later
        read raises, ``readable`` skips it) until the client is detached.
        """
        shm = self.sessions[session_id]
        if shm.refused:
            raise InvalidEpisode(shm.refused)
        try:
            rec = self._read_checked(shm, max_records)
        except InvalidEpisode as exc:
            shm.refused = str(exc)
            raise
        if len(rec):
            shm.done_episodes.extend(self._episodes(shm, rec))
        return rec

    def _read_checked(self, shm: ShmSession, max_records: int) -> np.ndarray:
        unread = shm.ring.readable_records()  # the client writes tail (and could write head)
        if not 0 <= unread <= shm.ring.capacity:
            raise InvalidEpisode(f"ring counters corrupt: {unread} unread records in a ring of "
                                 f"{shm.ring.capacity}")
        rec = shm.ring.read_batch(min(max_records, unread))  # the client may move tail meanwhile
        if len(rec):
            validate_records(rec, self.spaces)
        return rec

    def readable(self) -> list[int]:
        """Rings the drain loop should read: not refused, not leaving, with unread records."""
        return [sid for sid, s in self.sessions.items() if self._watched(s) and s.ring.readable_records()]

    def leave(self, session_id: int) -> None:
        """The connection closed: the drain loop stops looking at this ring (detach reads it)."""
        if session_id in self.sessions:
            self.sessions[session_id].leaving = True

    @staticmethod
    def _watched(s: ShmSession) -> bool:
        return not s.refused and not s.leaving

    def arm(self) -> bool:
        """Announce that the collector sleeps; True if a ring became readable meanwhile.

        Only unread records count as news here, not a ring's ``closed`` flag: clients
        leave by closing their socket, and a flag a client may set at will must not keep
        the drain loop spinning.
        """
        rings = [s.ring for s in self.sessions.values() if self._watched(s)]
        if not rings:
            return False
        arm_sleep(rings)
        return any(ring.readable_records() != 0 for ring in rings)

    @staticmethod
    def _episodes(shm: ShmSession, rec: np.ndarray) -> list[tuple[float, int]]:
        """(return, length) of episodes these records complete; carries partial sums.

        Vectorised per fragment: one cumulative sum, then a short loop over fragment ends.
        """
        flags = rec["flags"]
        ends = np.flatnonzero(flags & FINAL_OBS)                         # FINAL_OBS rows
        cum = np.cumsum(rec["reward"], dtype=np.float64)                 # [N]
        starts = np.concatenate(([0], ends[:-1] + 1))
        sums = cum[ends] - np.where(starts > 0, cum[starts - 1], 0.0)    # per fragment
        done = (flags[ends] & (TERMINATED | TRUNCATED)) != 0
        out = []
        for total, length, finished in zip(sums.tolist(), (ends - starts).tolist(), done.tolist()):
            shm.open_return += total
            shm.open_length += length
            if finished:
                out.append((shm.open_return, shm.open_length))
                shm.open_return, shm.open_length = 0.0, 0
        tail = ends[-1] + 1 if len(ends) else 0
        shm.open_return += float(cum[-1] - (cum[tail - 1] if tail else 0.0))
        shm.open_length += len(rec) - tail
        return out

    def close(self) -> None:
        for sid in list(self.sessions):
            self.detach(sid)


def pid_alive(pid: int) -> bool:
    """False once the process has exited (a zombie not yet reaped counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in (b"Z", b"X")


def validate_records(rec: np.ndarray, spaces: Spaces) -> None:
    """Every record must carry known flags, finite floats and values inside the spaces.

    Contract for producers: every float field of every record is finite (fields that do
    not apply are written as zeros); the action of a FINAL_OBS record is not checked.
    Vectorised: a few numpy passes per leaf, because this runs for every record a
    shared-memory client writes. Raises InvalidEpisode naming the first problem. The
    leaf checks are the spaces' own (the same ones TCP episodes pass).
    """
    flags = rec["flags"]
    if np.any(flags & np.uint8(0xFF ^ CLIENT_FLAGS)):
        raise InvalidEpisode("ring record with unknown or reserved flags")
    if np.any(((flags & (TERMINATED | TRUNCATED)) != 0) & ((flags & FINAL_OBS) == 0)):
        raise InvalidEpisode("TERMINATED/TRUNCATED set on a record that is not FINAL_OBS")
    for name in ("reward", "logp", "action", "dist"):
        if not np.isfinite(rec[name]).all():
            raise InvalidEpisode(f"ring record {name} contains NaN or Inf")
    is_step = (flags & FINAL_OBS) == 0  # select fields, never whole records (image copies)
    obs = read_obs(rec, spaces.obs)
    actions = rec["action"][is_step]
    error = (_check_obs(obs, spaces.obs)
             or check_action_vector(actions, spaces.act, "ring actions")
             or _check_ring_mask(obs, is_step, actions, spaces.mask))
    if error:
        raise InvalidEpisode(error)


def _check_obs(obs: Columns, space: Space) -> str | None:
    for leaf in space.leaves():
        error = leaf.space.check(obs[leaf.key], leaf.display("ring obs"))
        if error:
            return error
    return None


def _check_ring_mask(obs: Columns, is_step: np.ndarray, actions: np.ndarray,
                     mask: MaskSpec | None) -> str | None:
    """The masks of the step records (``is_step``) against their ``actions``."""
    if mask is None:
        return None
    what = f'ring obs["{mask.key}"]'
    masks = obs[mask.key][is_step]
    return check_masks(masks, mask, what) or check_actions(masks, actions, mask, "ring actions")
