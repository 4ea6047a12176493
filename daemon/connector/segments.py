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

from rlinkd.shm.records import FINAL_OBS, FLUSH, HAS_LOGP, STREAM_END, TERMINATED, TRUNCATED


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

    @property
    def num_steps(self) -> int:
        return len(self.rewards)

    @property
    def first_ingest_id(self) -> int:
        return int(self.ingest_ids[0])


def segment_from_records(rec: np.ndarray) -> Segment:
    """Build a Segment from one stream's records, the last being its FINAL_OBS record."""
    steps, final = rec[:-1], rec[-1]
    seqs = steps["weights_seq_no"]
    known = seqs[seqs >= 0]
    return Segment(
        stream_id=int(final["stream_id"]), obs=rec["obs"].copy(),
        actions=steps["action"].copy(), rewards=steps["reward"].astype(np.float32),
        logp=steps["logp"].copy(), has_logp=(steps["flags"] & HAS_LOGP) != 0,
        terminated=bool(final["flags"] & TERMINATED), truncated=bool(final["flags"] & TRUNCATED),
        behaviour_seq_no=int(known.min()) if known.size else -1,
        ingest_ids=rec["ingest_id"].copy())


def split_segment(seg: Segment, steps: int) -> list[Segment]:
    """Cut a segment after ``steps`` steps (the head bootstraps from obs[steps])."""
    head = replace(seg, obs=seg.obs[:steps + 1], actions=seg.actions[:steps],
                   rewards=seg.rewards[:steps], logp=seg.logp[:steps],
                   has_logp=seg.has_logp[:steps], terminated=False, truncated=False,
                   ingest_ids=seg.ingest_ids[:steps + 1])
    tail = replace(seg, obs=seg.obs[steps:], actions=seg.actions[steps:],
                   rewards=seg.rewards[steps:], logp=seg.logp[steps:],
                   has_logp=seg.has_logp[steps:], ingest_ids=seg.ingest_ids[steps:])
    return [head, tail]


class OpenRun:
    """One stream's records since its last segment, in a buffer grown by doubling (appending
    a batch's few records is one slice copy, not another array in a list)."""

    __slots__ = ("buf", "n")

    def __init__(self, first: np.ndarray) -> None:
        self.buf = np.empty(max(16, 2 * len(first)), first.dtype)
        self.n = 0
        self.append(first)

    def append(self, rec: np.ndarray) -> None:
        need = self.n + len(rec)
        if need > len(self.buf):
            grown = np.empty(max(need, 2 * len(self.buf)), self.buf.dtype)
            grown[:self.n] = self.buf[:self.n]
            self.buf = grown
        self.buf[self.n:need] = rec
        self.n = need

    def records(self) -> np.ndarray:
        """A view of the open records (valid until the next append)."""
        return self.buf[:self.n]


class SegmentAssembler:
    """Groups interleaved records into complete segments; remembers flush requests.

    Called by the connector for every batch it reads: one stable sort by stream, then per
    stream in the batch one slice appended to its ``OpenRun`` and a segment per FINAL_OBS.
    """

    def __init__(self, max_open_steps: int | None = None) -> None:
        self.max_open_steps = max_open_steps
        self.open: dict[int, OpenRun] = {}
        self.max_ingest_id = 0
        self.flush_requested = False

    def add(self, records: np.ndarray) -> list[Segment]:
        """Consume records (any streams, ring order); return the segments they complete."""
        if not len(records):
            return []
        self.max_ingest_id = max(self.max_ingest_id, int(records["ingest_id"].max()))
        is_marker = (records["flags"] & (FLUSH | STREAM_END)) != 0
        markers = records[is_marker] if is_marker.any() else records[:0]
        if len(markers):
            records = records[~is_marker]
            self.flush_requested |= bool(np.any(markers["flags"] & FLUSH))
        done: list[Segment] = []
        for stream, rec in by_stream(records):
            done.extend(self._add_stream(stream, rec))
        for stream in markers["stream_id"][(markers["flags"] & STREAM_END) != 0]:
            done.extend(self.end_stream(int(stream)))
        done.sort(key=lambda s: s.first_ingest_id)
        return done

    def end_stream(self, stream: int) -> list[Segment]:
        """The stream's client left: its open steps become a cut segment (nothing is lost
        that can be trained on: the last record's obs is the bootstrap observation)."""
        run = self.open.pop(stream, None)
        if run is None or run.n < 2:
            return []
        rec = run.records().copy()
        rec["flags"][-1] = FINAL_OBS
        return [segment_from_records(rec)]

    def _add_stream(self, stream: int, rec: np.ndarray) -> list[Segment]:
        ends = np.flatnonzero(rec["flags"] & FINAL_OBS)
        out, start = [], 0
        for end in ends:
            run = self.open.pop(stream, None)
            if run is None:
                out.append(segment_from_records(rec[start:end + 1]))
            else:
                run.append(rec[start:end + 1])
                out.append(segment_from_records(run.records()))  # (it copies what it keeps)
            start = int(end) + 1
        if start < len(rec):
            run = self.open.get(stream)
            if run is None:
                self.open[stream] = OpenRun(rec[start:])
            else:
                run.append(rec[start:])
            out.extend(self._cut_if_too_long(stream))
        return out

    def _cut_if_too_long(self, stream: int) -> list[Segment]:
        """Bound memory: an open run longer than max_open_steps becomes a cut segment.

        The last record stays open (its obs is both the cut's bootstrap observation and
        the first observation of the continuation), as an RLlink fragment cut would.
        """
        run = self.open[stream]
        if self.max_open_steps is None or run.n <= self.max_open_steps:
            return []
        rec = run.records().copy()
        self.open[stream] = OpenRun(rec[-1:])
        rec["flags"][-1] = FINAL_OBS
        return [segment_from_records(rec)]

    def open_steps(self) -> int:
        return sum(run.n for run in self.open.values())


def by_stream(records: np.ndarray):
    """(stream id, its records in ring order) for each stream of a batch: one stable sort."""
    ids = records["stream_id"]
    if not len(ids):
        return
    if ids[0] == ids[-1] and (ids == ids[0]).all():
        yield int(ids[0]), records
        return
    order = np.argsort(ids, kind="stable")
    rec = records[order]
    streams, starts = np.unique(rec["stream_id"], return_index=True)
    bounds = [*starts[1:].tolist(), len(rec)]
    for stream, a, b in zip(streams.tolist(), starts.tolist(), bounds):
        yield stream, rec[a:b]
