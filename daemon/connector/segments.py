"""Step records → segments: per-stream runs of steps ending in a FINAL_OBS record.

``SegmentAssembler.add(records)`` is called by the connector for every batch read
from the episode ring (records of many streams interleaved, each stream in order).
A segment is one fragment of one episode: T steps plus the observation after the
last step. It ended ``terminated`` (no bootstrap), ``truncated`` or was cut between
two RLlink fragments (bootstrap from V(final obs) either way).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from rlinkd.shm.records import FINAL_OBS, FLUSH, HAS_LOGP, HAS_STATE, STREAM_END, TERMINATED, TRUNCATED

NO_SEQ = np.iinfo(np.int64).max  # (no known behaviour version among a run's steps)


@dataclass
class Segment:
    """One episode fragment, as arrays."""

    stream_id: int
    obs: np.ndarray          # [T+1] the records' obs: structured, one field per leaf
    actions: np.ndarray      # [T, A]
    rewards: np.ndarray      # [T]
    logp: np.ndarray         # [T] (meaningful where has_logp)
    has_logp: np.ndarray     # [T] bool
    terminated: bool
    truncated: bool
    behaviour_seq_no: int    # oldest policy version that acted in it (-1 unknown)
    ingest_ids: np.ndarray   # [T+1] collector-assigned ids of its records
    states: np.ndarray | None = None     # [T, S] the records' state field (recurrent policies)
    has_state: np.ndarray | None = None  # [T] bool: HAS_STATE (the actor's state before the step)

    @property
    def num_steps(self) -> int:
        return len(self.rewards)

    @property
    def first_ingest_id(self) -> int:
        return int(self.ingest_ids[0])


def segment_from_records(rec: np.ndarray) -> Segment:
    """Build a Segment from one stream's records, the last being its FINAL_OBS record."""
    return segments_from_runs(rec, np.array([len(rec)]))[0]


def segments_from_runs(rec: np.ndarray, stops: np.ndarray) -> list[Segment]:
    """The Segments of consecutive runs of ``rec``, run k being rows [stops[k-1], stops[k])
    of one stream, its last row a FINAL_OBS record. Each field is copied once for all runs
    (contiguous; ``rec`` is not kept); a segment's arrays are slices of those copies, so a
    batch's segments share memory (nothing downstream writes into a segment)."""
    starts = np.concatenate(([0], stops[:-1]))
    flags, ids = rec["flags"], rec["ingest_id"].copy()
    obs, actions, logp = rec["obs"].copy(), rec["action"].copy(), rec["logp"].copy()
    rewards, has_logp = rec["reward"].astype(np.float32), (flags & HAS_LOGP) != 0
    states, has_state = _states(rec)
    seqs = rec["weights_seq_no"].astype(np.int64)
    seqs[(seqs < 0) | ((flags & FINAL_OBS) != 0)] = NO_SEQ                       # steps' known versions
    oldest = np.minimum.reduceat(seqs, starts)                                     # [runs]
    final = flags[stops - 1]
    return [Segment(stream_id=stream, obs=obs[a:b], actions=actions[a:b - 1], rewards=rewards[a:b - 1],
                    logp=logp[a:b - 1], has_logp=has_logp[a:b - 1], terminated=bool(f & TERMINATED),
                    truncated=bool(f & TRUNCATED), behaviour_seq_no=-1 if old == NO_SEQ else old,
                    ingest_ids=ids[a:b], states=states[a:b - 1], has_state=has_state[a:b - 1])
            for stream, a, b, f, old in zip(rec["stream_id"][stops - 1].tolist(), starts.tolist(),
                                            stops.tolist(), final.tolist(), oldest.tolist())]


def _states(rec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([N, S] state field, [N] HAS_STATE) of records; S = 0 without a state field."""
    has_state = (rec["flags"] & HAS_STATE) != 0
    if rec.dtype.names is not None and "state" in rec.dtype.names:
        return rec["state"].copy(), has_state
    return np.zeros((len(rec), 0), np.float32), has_state


def grid_cut(has_state: np.ndarray | None, steps: int) -> int:
    """Where to cut a run of steps at most ``steps`` in so that the continuation starts on a
    row carrying the actor's state: the last HAS_STATE row in (0, steps], or ``steps`` when
    the run has none (a feed-forward policy: any row will do)."""
    if has_state is None or steps < 1:
        return steps
    rows = np.flatnonzero(has_state[1:steps + 1]) + 1
    return int(rows[-1]) if len(rows) else steps


def split_segment(seg: Segment, steps: int) -> list[Segment]:
    """Cut a segment after ``steps`` steps (the head bootstraps from obs[steps])."""
    head = replace(seg, obs=seg.obs[:steps + 1], actions=seg.actions[:steps],
                   rewards=seg.rewards[:steps], logp=seg.logp[:steps],
                   has_logp=seg.has_logp[:steps], terminated=False, truncated=False,
                   ingest_ids=seg.ingest_ids[:steps + 1], states=_rows(seg.states, slice(None, steps)),
                   has_state=_rows(seg.has_state, slice(None, steps)))
    tail = replace(seg, obs=seg.obs[steps:], actions=seg.actions[steps:],
                   rewards=seg.rewards[steps:], logp=seg.logp[steps:],
                   has_logp=seg.has_logp[steps:], ingest_ids=seg.ingest_ids[steps:],
                   states=_rows(seg.states, slice(steps, None)),
                   has_state=_rows(seg.has_state, slice(steps, None)))
    return [head, tail]


def _rows(column: np.ndarray | None, rows: slice) -> np.ndarray | None:
    return None if column is None else column[rows]


class SegmentAssembler:
    """Groups interleaved records into complete segments; remembers flush requests.

    Called by the connector for every batch it reads (any streams interleaved, each in
    ring order). Open records of every stream wait in one pool, in ring order: a batch is
    appended with one slice copy, and a stream's records are gathered (one vectorised scan
    of the pool) only when a FINAL_OBS completes its segment, so a batch of many streams
    with a record each costs a few numpy calls, not Python work per stream. Taken rows
    are marked dead; the pool is compacted when more than half of it is dead.
    """

    def __init__(self, max_open_steps: int | None = None) -> None:
        self.max_open_steps = max_open_steps
        self.pool: np.ndarray | None = None  # records [capacity]; rows [0, n) used
        self.alive = np.zeros(0, bool)
        self.n = 0
        self.live = 0          # alive rows (open steps of every stream)
        self.recheck_in = 0    # records to add before a stream could pass max_open_steps
        self.max_ingest_id = 0
        self.flush_requested = False

    def add(self, records: np.ndarray) -> list[Segment]:
        """Consume records (any streams, ring order); return the segments they complete."""
        if not len(records):
            return []
        self.max_ingest_id = max(self.max_ingest_id, int(records["ingest_id"].max()))
        is_marker = (records["flags"] & (FLUSH | STREAM_END)) != 0
        markers = records[:0]
        if is_marker.any():
            markers, records = records[is_marker], records[~is_marker]
            self.flush_requested |= bool(np.any(markers["flags"] & FLUSH))
        done: list[Segment] = []
        if len(records):
            done.extend(self._add_records(records))
        for stream in markers["stream_id"][(markers["flags"] & STREAM_END) != 0]:
            done.extend(self.end_stream(int(stream)))
        self._compact()
        done.sort(key=lambda s: s.first_ingest_id)
        return done

    def end_stream(self, stream: int) -> list[Segment]:
        """The stream's client left: its open steps become a cut segment (nothing is lost
        that can be trained on: the last record's obs is the bootstrap observation)."""
        rows = self._rows(stream)
        if not len(rows):
            return []
        rec = self._take(rows)
        if len(rec) < 2:
            return []
        rec["flags"][-1] = FINAL_OBS
        return [segment_from_records(rec)]

    def open_steps(self) -> int:
        return self.live

    # ------------------------------------------------------------ the pool
    def _add_records(self, records: np.ndarray) -> list[Segment]:
        """Append a batch; its FINAL_OBS records complete their streams' segments."""
        start = self._append(records)
        ends = start + np.flatnonzero(records["flags"] & FINAL_OBS)
        out = self._complete(ends) if len(ends) else []
        return out + self._cut_long_runs(len(records))

    def _complete(self, ends: np.ndarray) -> list[Segment]:
        """The segments completed by the FINAL_OBS rows ``ends`` (every alive FINAL_OBS row:
        a completed segment is taken at once), in one pass however many streams end: the
        alive rows up to the last end, grouped by stream (a stable sort keeps ring order);
        a stream's rows up to its last end are taken, cut after each end, gathered in one
        copy."""
        pool = self._pool()
        rows = np.flatnonzero(self.alive[:int(ends[-1]) + 1])
        streams = pool["stream_id"][rows]
        order = np.argsort(streams, kind="stable")
        rows, streams = rows[order], streams[order]                        # [R] by stream, ring order
        group = np.cumsum(np.concatenate(([True], streams[1:] != streams[:-1]))) - 1
        end_pos = np.flatnonzero(pool["flags"][rows] & FINAL_OBS)           # [E] ascending
        last = np.concatenate((group[end_pos][1:] != group[end_pos][:-1], [True]))
        last_end = np.full(int(group[-1]) + 1, -1)
        last_end[group[end_pos][last]] = end_pos[last]                     # per stream (-1: none)
        taken = np.flatnonzero(np.arange(len(rows)) <= last_end[group])    # [T] whole runs
        stops = np.searchsorted(taken, end_pos) + 1                        # run ends, in [T]
        return segments_from_runs(self._take(rows[taken]), stops)

    def _pool(self) -> np.ndarray:
        assert self.pool is not None
        return self.pool

    def _append(self, rec: np.ndarray) -> int:
        need = self.n + len(rec)
        if self.pool is None or need > len(self.pool):
            grown = np.empty(max(need, 2 * self.n, 256), rec.dtype)
            if self.pool is not None:
                grown[:self.n] = self.pool[:self.n]
            self.pool = grown
            self.alive = np.concatenate([self.alive[:self.n], np.zeros(len(grown) - self.n, bool)])
        start = self.n
        self.pool[start:need] = rec
        self.alive[start:need] = True
        self.n, self.live = need, self.live + len(rec)
        return start

    def _rows(self, stream: int, last: int | None = None) -> np.ndarray:
        """Alive rows of ``stream`` up to row ``last`` (default: all), in ring order."""
        if self.pool is None:
            return np.zeros(0, np.int64)
        n = self.n if last is None else last + 1
        return np.flatnonzero(self.alive[:n] & (self.pool["stream_id"][:n] == stream))

    def _take(self, rows: np.ndarray) -> np.ndarray:
        """Copies of ``rows`` (some), which are dead from now on."""
        out = self._pool()[rows]
        self.alive[rows] = False
        self.live -= len(rows)
        return out

    def _cut_long_runs(self, added: int) -> list[Segment]:
        """Bound memory: an open run longer than max_open_steps becomes a cut segment.

        The last record stays open (its obs is both the cut's bootstrap observation and
        the first observation of the continuation), as an RLlink fragment cut would. A
        recurrent policy's run is cut on its state grid (``grid_cut``): the continuation
        starts on a HAS_STATE row, so its first chunk starts from the actor's state. The
        per-stream count is taken only once enough records came for some run to pass it.
        """
        self.recheck_in -= added
        if self.max_open_steps is None or self.live <= self.max_open_steps or self.recheck_in > 0:
            return []
        pool = self._pool()
        streams, counts = np.unique(pool["stream_id"][np.flatnonzero(self.alive[:self.n])],
                                    return_counts=True)
        out = []
        for stream in streams[counts > self.max_open_steps].tolist():
            rows = self._rows(stream)
            keep = grid_cut((pool["flags"][rows] & HAS_STATE) != 0, len(rows) - 1)
            rec = pool[rows[:keep + 1]]  # (row ``keep`` stays alive: it continues the run)
            self._take(rows[:keep])
            rec["flags"][-1] = FINAL_OBS
            out.append(segment_from_records(rec))
        kept = counts[counts <= self.max_open_steps]
        self.recheck_in = self.max_open_steps - (int(kept.max()) if len(kept) else 0)
        return out

    def _compact(self) -> None:
        """Drop dead rows once they are most of a pool of 1,024 rows or more (order kept)."""
        if self.pool is None or self.n < 1024 or self.live > self.n // 2:
            return
        keep = np.flatnonzero(self.alive[:self.n])
        self.pool[:len(keep)] = self.pool[keep]
        self.alive[:len(keep)] = True
        self.alive[len(keep):self.n] = False
        self.n = len(keep)
