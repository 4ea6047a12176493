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
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.client_lib.protocol.columns import Columns, check_action_vector
from rlinkd.client_lib.protocol.masking import MaskSpec, check_actions, check_masks
from rlinkd.client_lib.protocol.records import read_obs
from rlinkd.client_lib.protocol.spaces import Space
from rlinkd.daemon.collector.ingest import InvalidEpisode, Spaces
from rlinkd.shm.records import FINAL_OBS, HAS_DIST, HAS_LOGP, HAS_STATE, TERMINATED, TRUNCATED
from rlinkd.shm.ring import StepRing, arm_sleep

CLIENT_FLAGS = FINAL_OBS | TERMINATED | TRUNCATED | HAS_LOGP | HAS_DIST
DEFAULT_RING_RECORDS = 1 << 15
MAX_RING_RECORDS = 1 << 20


@dataclass
class PolicyRing:
    """One attached client's ring for one policy, and the agent slots seen in it."""

    ring: StepRing
    policy: str
    streams: np.ndarray            # agent slot -> our stream id (-1: not seen yet)
    open_return: np.ndarray        # agent slot -> return of its episode so far
    open_length: np.ndarray        # agent slot -> steps of its episode so far
    frag_pos: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    #                                agent slot -> position in its open fragment (state grid)
    last_ingest_id: int = 0
    unsent: bool = False           # records since the last SAMPLE_READY


@dataclass
class ShmSession:
    """One attached client: its rings (one per policy) and episode accounting."""

    stream_id: int                 # the connection's own stream (slot 0 of the default ring)
    rings: dict[str, PolicyRing] = field(default_factory=dict)
    pid: int | None = None         # the attaching process (SO_PEERCRED), watched for exit
    done_episodes: list = field(default_factory=list)  # (policy, return, length)
    refused: str | None = None     # why a ring was found bad; never read again
    leaving: bool = False          # its connection closed: only the detach drain reads it now
    max_slots: int = 0             # agent slots allowed (0: server.max_agents_per_connection)


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
    """Rings of attached clients, keyed by session id and policy. Used only by the event loop.

    ``policies``: what each policy's records are checked against (``core.PolicyInfo``);
    ``new_stream_id``: the core's allocator, one stream per (client, policy, agent slot);
    slot 0 of the default policy's ring is the connection's own stream (a single-agent
    client's records look exactly as before agent slots existed).
    """

    def __init__(self, prefix: str, policies: dict, max_agents: int,
                 new_stream_id: Callable[[], int]) -> None:
        self.prefix, self.policies, self.max_agents = prefix, policies, max_agents
        self.new_stream_id = new_stream_id
        self.sessions: dict[int, ShmSession] = {}

    def attach(self, session_id: int, stream_id: int, policy: str, capacity: int | None,
               pid: int | None = None, max_slots: int = 0) -> StepRing:
        """Create the sealed ring of one client for one policy; ``ring.segment.fd`` is what to
        hand it. Called on ATTACH. Raises ``ShmError`` (no memory) or ``OSError`` (memfds or
        seals unavailable); nothing is registered then.
        """
        layout = self.policies[policy].layout
        kind = "inference" if max_slots else "client"  # (the daemon's own role: not a client)
        name = f"{self.prefix}.{kind}-{session_id}-{policy}-{secrets.token_hex(4)}"
        ring = StepRing.create_sealed(name, layout, ring_capacity(capacity, layout.record_bytes))
        shm = self.sessions.setdefault(session_id, ShmSession(stream_id, pid=pid, max_slots=max_slots))
        streams = np.full(1, -1, np.int64)
        if policy == DEFAULT_POLICY:
            streams[0] = stream_id
        shm.rings[policy] = PolicyRing(ring, policy, streams, np.zeros(1), np.zeros(1, np.int64))
        return ring

    def gone(self) -> list[int]:
        """Sessions whose attaching process has exited (its socket may live on in a child)."""
        return [sid for sid, s in self.sessions.items() if s.pid and not pid_alive(s.pid)]

    def detach(self, session_id: int) -> None:
        """Forget a client and close its rings: our mappings and descriptors (idempotent)."""
        shm = self.sessions.pop(session_id, None)
        if shm is not None:
            for pr in shm.rings.values():
                pr.ring.close()

    def streams(self, session_id: int) -> list[tuple[str, int]]:
        """(policy, stream id) of every agent slot a client used (for STREAM_END markers)."""
        shm = self.sessions.get(session_id)
        if shm is None:
            return []
        return [(p, int(sid)) for p, pr in shm.rings.items() for sid in pr.streams if sid >= 0]

    def read(self, session_id: int, policy: str, max_records: int) -> np.ndarray:
        """Validated records from one client's ring of one policy, stamped with our stream
        ids (one per agent slot).

        Raises InvalidEpisode on bad data; from then on the client is refused (every later
        read raises, ``readable`` skips it) until it is detached.
        """
        shm = self.sessions[session_id]
        if shm.refused:
            raise InvalidEpisode(shm.refused)
        pr = shm.rings[policy]
        try:
            rec = self._read_checked(pr, max_records)
            if len(rec):
                self._stamp(shm, pr, rec)
        except InvalidEpisode as exc:
            shm.refused = str(exc)
            raise
        return rec

    def _read_checked(self, pr: PolicyRing, max_records: int) -> np.ndarray:
        unread = pr.ring.readable_records()  # the client writes tail (and could write head)
        if not 0 <= unread <= pr.ring.capacity:
            raise InvalidEpisode(f"ring counters corrupt: {unread} unread records in a ring of "
                                 f"{pr.ring.capacity}")
        rec = pr.ring.read_batch(min(max_records, unread))  # the client may move tail meanwhile
        if len(rec):
            validate_records(rec, self.policies[pr.policy].spaces)
        return rec

    def _stamp(self, shm: ShmSession, pr: PolicyRing, rec: np.ndarray) -> None:
        """Account the records' episodes per agent slot, then replace each slot by our stream
        id. One slot (a single agent): scalar work only, the fast path."""
        slots = rec["stream_id"]
        lo, hi = int(slots.min()), int(slots.max())
        if hi >= (shm.max_slots or self.max_agents):
            raise InvalidEpisode(f"ring record agent slot {hi} is not below "
                                 f"server.max_agents_per_connection={self.max_agents}")
        _make_room(pr, hi)
        max_seq_len = self.policies[pr.policy].spaces.max_seq_len
        if max_seq_len:
            check_state_grid(rec["flags"], slots, pr.frag_pos, max_seq_len)
        if lo == hi:
            done = _slot_episodes(pr, hi, rec)
            if pr.streams[hi] < 0:
                pr.streams[hi] = self.new_stream_id()
            rec["stream_id"] = pr.streams[hi]
        else:
            done = _many_slot_episodes(pr, rec, slots)
            for slot in np.unique(slots[pr.streams[slots] < 0]):
                pr.streams[slot] = self.new_stream_id()
            rec["stream_id"] = pr.streams[slots]
        shm.done_episodes.extend((pr.policy, r, n) for r, n in done)
        pr.unsent = True

    def readable(self) -> list[tuple[int, str]]:
        """(session, policy) rings the drain loop should read: not refused, not leaving,
        with unread records."""
        return [(sid, p) for sid, s in self.sessions.items() if self._watched(s)
                for p, pr in s.rings.items() if pr.ring.readable_records()]

    def leave(self, session_id: int) -> None:
        """The connection closed: the drain loop stops looking at its rings (detach reads them)."""
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
        rings = [pr.ring for s in self.sessions.values() if self._watched(s) for pr in s.rings.values()]
        if not rings:
            return False
        arm_sleep(rings)
        return any(ring.readable_records() != 0 for ring in rings)

    def close(self) -> None:
        for sid in list(self.sessions):
            self.detach(sid)


def _many_slot_episodes(pr: PolicyRing, rec: np.ndarray, slots: np.ndarray) -> list[tuple[float, int]]:
    """Episode accounting of records of many agent slots, without a loop over records or
    slots: records are grouped by slot (a stable sort keeps each slot's order), cut into
    episode pieces (a new piece after each TERMINATED/TRUNCATED FINAL_OBS record), each piece
    summed with ``bincount``; a slot's first piece continues its open episode, its last one
    (unless finished) becomes the new open episode."""
    order = np.argsort(slots, kind="stable")
    s, flags = slots[order], rec["flags"][order]
    final = (flags & FINAL_OBS) != 0
    done = final & ((flags & (TERMINATED | TRUNCATED)) != 0)
    group_start = np.ones(len(s), bool)
    group_start[1:] = s[1:] != s[:-1]
    piece_start = group_start.copy()
    piece_start[1:] |= done[:-1]
    piece = np.cumsum(piece_start) - 1
    ret = np.bincount(piece, weights=rec["reward"][order].astype(np.float64))
    length = np.bincount(piece, weights=~final).astype(np.int64)
    first = np.flatnonzero(piece_start)
    piece_slot = s[first]
    carry = group_start[first]                                   # continues the open episode
    ret[carry] += pr.open_return[piece_slot[carry]]
    length[carry] += pr.open_length[piece_slot[carry]]
    finished = done[np.append(first[1:] - 1, len(s) - 1)]         # each piece's last record
    last = np.append(piece_slot[1:] != piece_slot[:-1], True)     # each slot's last piece
    keep = ~finished[last]
    pr.open_return[piece_slot[last]] = np.where(keep, ret[last], 0.0)
    pr.open_length[piece_slot[last]] = np.where(keep, length[last], 0)
    return list(zip(ret[finished].tolist(), length[finished].tolist()))


def _make_room(pr: PolicyRing, slot: int) -> None:
    """Grow a ring's per-slot arrays (doubling) so that ``slot`` has an entry."""
    if slot < len(pr.streams):
        return
    size = max(slot + 1, 2 * len(pr.streams))
    pr.streams = _grown(pr.streams, size, -1)
    pr.open_return, pr.open_length = _grown(pr.open_return, size, 0), _grown(pr.open_length, size, 0)
    pr.frag_pos = _grown(pr.frag_pos, size, 0)


def _grown(values: np.ndarray, size: int, fill) -> np.ndarray:
    out = np.full(size, fill, values.dtype)
    out[:len(values)] = values
    return out


def _slot_episodes(pr: PolicyRing, slot: int, rec: np.ndarray) -> list[tuple[float, int]]:
    """Episodes one agent slot's records complete (vectorised: one cumulative sum, then a
    short loop over fragment ends); updates the slot's carried return and length."""
    flags = rec["flags"]
    ends = np.flatnonzero(flags & FINAL_OBS)                         # FINAL_OBS rows
    cum = np.cumsum(rec["reward"], dtype=np.float64)                 # [N]
    starts = np.concatenate(([0], ends[:-1] + 1))
    sums = cum[ends] - np.where(starts > 0, cum[starts - 1], 0.0)    # per fragment
    done = (flags[ends] & (TERMINATED | TRUNCATED)) != 0
    out = []
    ret, length = float(pr.open_return[slot]), int(pr.open_length[slot])
    for total, steps, finished in zip(sums.tolist(), (ends - starts).tolist(), done.tolist()):
        ret, length = ret + total, length + steps
        if finished:
            out.append((ret, length))
            ret, length = 0.0, 0
    tail = ends[-1] + 1 if len(ends) else 0
    pr.open_return[slot] = ret + float(cum[-1] - (cum[tail - 1] if tail else 0.0))
    pr.open_length[slot] = length + len(rec) - tail
    return out


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
    allowed = CLIENT_FLAGS | (HAS_STATE if spaces.state_size else 0)
    if np.any(flags & np.uint8(0xFF ^ allowed)):
        raise InvalidEpisode("ring record with unknown or reserved flags")
    if np.any(((flags & (TERMINATED | TRUNCATED)) != 0) & ((flags & FINAL_OBS) == 0)):
        raise InvalidEpisode("TERMINATED/TRUNCATED set on a record that is not FINAL_OBS")
    for name in ("reward", "logp", "action", "dist") + (("state",) if spaces.state_size else ()):
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


def check_state_grid(flags: np.ndarray, slots: np.ndarray, frag_pos: np.ndarray,
                     max_seq_len: int) -> None:
    """A recurrent policy's ring records: HAS_STATE on exactly the step records at fragment
    positions 0, L, 2L, ... of each agent slot (``frag_pos[slot]``: the slot's position in
    its open fragment, carried across reads and updated here). InvalidEpisode otherwise."""
    order = np.argsort(slots, kind="stable")
    s, f = slots[order], flags[order]
    final = (f & FINAL_OBS) != 0
    group_start = np.ones(len(s), bool)
    group_start[1:] = s[1:] != s[:-1]
    piece_start = group_start.copy()
    piece_start[1:] |= final[:-1]                                # a fragment ends at FINAL_OBS
    piece = np.cumsum(piece_start) - 1
    first = np.flatnonzero(piece_start)
    base = np.where(group_start[first], frag_pos[s[first]], 0) - first   # [pieces]
    pos = np.arange(len(s)) + base[piece]                        # position in the fragment
    expected = ~final & (pos % max_seq_len == 0)
    if np.any(((f & HAS_STATE) != 0) != expected):
        raise InvalidEpisode(f"ring records: HAS_STATE must flag exactly the fragment "
                             f"positions 0, {max_seq_len}, ... (the state grid)")
    last = np.append(group_start[1:], True)                      # each slot's last record
    frag_pos[s[last]] = np.where(final[last], 0, pos[last] + 1)


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
